"""Data: prompt datasets for RL (``data`` group, loop ``rl``) and preference pairs for reward models (loop ``rm``)."""
