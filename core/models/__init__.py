"""Models: loading and locally built tiny models, log-prob and padding-free forwards, the critic, reward models
and the supervised warm start (``model`` group)."""
