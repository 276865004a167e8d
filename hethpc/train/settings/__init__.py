"""The settings of a run: the configuration, its rules, where it is read from, its autos."""
