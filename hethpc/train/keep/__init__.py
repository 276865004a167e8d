"""What outlasts a process: checkpoints and what they hold, random-number state, run directories."""
