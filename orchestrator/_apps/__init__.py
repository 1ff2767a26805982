"""What apps see: reporters, events, the console reporter, approvals that wait for a person.

Above `_record`. What a reporter needs of the run in progress it asks through `_base._here`.
"""

__all__ = ()
