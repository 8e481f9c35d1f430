"""Learning benchmark: train rl8's presets over seeds and publish their curves (see run.py)."""
