"""PyAV's log levels (the values LeRobot reads at import) and no-op callbacks; see the package doc."""
ERROR, WARNING, INFO, DEBUG = 16, 24, 32, 48


def restore_default_callback() -> None:
    return None


def set_level(level: int) -> None:
    return None
