"""The one exception type for bad input anywhere in schedlab."""

__all__ = ["ScheduleError"]


class ScheduleError(ValueError):
    """Bad input: an unknown schedule, impossible parameters, an invalid program.

    The message is one line that names the offending value and what would be valid.
    """
