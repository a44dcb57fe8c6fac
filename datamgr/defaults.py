"""The data manager's defaults that the `silod` command line shows in its help.

Here rather than in the server, the client and the controller, so that building the command line loads none
of them (nor gRPC): every `silod` command builds the whole command line, and most need none of them.
"""

DEFAULT_LISTEN = "127.0.0.1:7420"  # where the data manager serves
DEFAULT_DATAMGR = DEFAULT_LISTEN  # where clients and node agents look for it
DATAMGR_ENV = "SILOD_DATAMGR"  # what overrides that for them
EXTERNAL_POLICY = "external"  # --policy value that leaves allocation to outside callers
DEFAULT_ROUND_SECONDS = 30.0  # with --policy: the longest time between two rounds
