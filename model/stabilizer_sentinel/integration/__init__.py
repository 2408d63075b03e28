"""How a script gets watched: the integration levels and the guard they all build.

``script_watch``        the plain-loop level: ``watch(model, optimizer)`` builds the guard a script asks for
``guard``               ``Guard``: the sentinel, capture, rewind and the watchdog wired by hooks into any loop
``launcher_hooks``      the unchanged-script level: the global hooks that find a script's model, optimizer and
                        loss (``python -m stabilizer_sentinel.launch``, the autostart ``sitecustomize``)
``lightning_callback``  the Lightning level: ``SentinelCallback`` (documented as
                        ``stabilizer_sentinel.lightning_callback``)
``exit_status``         how a watched script ended when ``SystemExit`` ended it
``log_channel``         the job's log as a second channel: the loss its own lines report

It stands on detection/, recovery/, rules/, loops/ and capture/; none of them imports it.
"""
