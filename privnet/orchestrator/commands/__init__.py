"""The `privnet` commands, one module a group; `privnet.orchestrator.cli` holds the argument table
and the entry point. Each command is a pair: `<command>_config(args)` checks the flags (and
TOML files) before anything starts and returns what the command runs with, and
`<command>(args, that)` runs it, returning the exit code."""
