"""What keeps a run safe: the watchdog, the checks that ranks agree, deliberate faults."""
