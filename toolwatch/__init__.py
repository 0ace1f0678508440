"""toolwatch: catch abusive AI agents in MCP server tool-call logs.

The glue package: configuration, the forensic store, the pipeline that runs sources
through transforms into the store and detectors, and the ``toolwatch`` CLI.
"""

__version__ = "0.1.0"
