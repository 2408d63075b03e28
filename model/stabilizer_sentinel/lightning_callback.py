"""The documented import path of the Lightning level (docs/library.md)::

    from stabilizer_sentinel.lightning_callback import SentinelCallback

The callback lives in stabilizer_sentinel.integration.lightning_callback; this module only re-exports it.
"""

from stabilizer_sentinel.integration.lightning_callback import SentinelCallback

__all__ = ["SentinelCallback"]
