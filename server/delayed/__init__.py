"""Delayed messages: the stores of `x-delayed-message` exchanges, and their routing when due.

`exchanges/delayed.py` is the exchange type (its arguments, which `x-delay` holds a message,
where routing stops). Here: `DelayedMessageLog` (`message_log.py`) stores one exchange's held
messages in a partition log and indexes them by due time (`due_index.py`) with one bit per
routed offset (`acked.py`), its routed log (`routed_log.py`) recording what is done and what
is being routed; `DelayedStore` (`store.py`) is that log hosted by the broker's tick like a
queue; `DelayedExchanges` (`exchanges.py`) is a vhost's set of them and the exactly-once
hand-off of due messages through the core.
"""

from .exchanges import DelayedExchanges
from .message_log import DelayedLogConfig, DelayedMessageLog

__all__ = ["DelayedExchanges", "DelayedLogConfig", "DelayedMessageLog"]
