"""Planning a run before it starts (``python -m recipes.plan``): its memory per GPU (memory.py, states.py, knobs.py)
and its time per step (step_time.py)."""
