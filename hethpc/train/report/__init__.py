"""What a run tells: per-step metrics and their outputs, progress, counts and the summary."""
