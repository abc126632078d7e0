"""The subcommands of `wpk`, one module each; `COMMANDS` maps a name to its module.

Every module defines `command` (a click command or group) next to the logic it
presents; `wpk.cli` imports a module only when its subcommand runs (or for
`--help`), so `wpk run` never loads the build pipeline.
"""

COMMANDS = {
    "build": "wpk.commands.build",
    "run": "wpk.commands.run",
    "report": "wpk.commands.report",
    "inspect": "wpk.commands.inspect",
    "dsl": "wpk.commands.dsl",
    "devices": "wpk.commands.devices",
    "op": "wpk.commands.op",
    "tune": "wpk.commands.tune",
    "records": "wpk.commands.records",
}
