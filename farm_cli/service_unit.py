"""The worker as a service that comes back after a reboot: a launchd agent on a Mac, a systemd user
unit on Linux, both from the templates in ops/ (the same agent ops/install-worker.sh installs, with
`farm join` as its command so the coordinator is found again at every start)."""

from __future__ import annotations

import os
import plistlib
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

OPS = Path(__file__).resolve().parent.parent / "ops"
LABEL = "com.ltxfarm.worker"  # one worker agent per Mac: join replaces one install-worker.sh wrote
SYSTEMD_UNIT = "ltx-farm-worker.service"


@dataclass
class ServiceUnit:
    """A unit file to write and the commands that load it into the service manager."""

    path: Path
    text: str
    activate: list[list[str]] = field(default_factory=list)

    def write(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        tmp.write_text(self.text)
        os.replace(tmp, self.path)

    def run_activation(self) -> None:
        """Load the unit now (a bootout of an agent that is not loaded fails, harmlessly)."""
        for command in self.activate:
            subprocess.run(command, check="bootout" not in command, capture_output=True, text=True, timeout=60)


def farm_command() -> list[str]:
    """How to run `farm` from a service or an exec: this venv's script, else this Python's -m farm_cli."""
    script = Path(sys.executable).with_name("farm")
    return [str(script)] if script.is_file() else [sys.executable, "-m", "farm_cli"]


def service_unit(farm_home: Path, farm_args: list[str], platform: str = sys.platform,
                 home: Path | None = None) -> ServiceUnit:
    """The unit running `farm ARGS` for this user on this system, with its logs under FARM_HOME/logs."""
    home = home or Path.home()
    command = [*farm_command(), *farm_args]
    if platform == "darwin":
        return launchd_agent(farm_home, command, home)
    return systemd_user_unit(farm_home, command, home)


def launchd_agent(farm_home: Path, command: list[str], home: Path) -> ServiceUnit:
    """ops/launchd's worker agent with `command` as its program (placeholders filled as
    install-worker.sh fills them), for ~/Library/LaunchAgents."""
    template = (OPS / "launchd" / f"{LABEL}.plist").read_text()
    fills = {"__FARM_HOME__": str(farm_home), "__LOG_DIR__": str(farm_home / "logs"),
             "__HF_HOME__": os.environ.get("HF_HOME", str(home / ".cache" / "huggingface"))}
    for placeholder, value in fills.items():
        template = template.replace(placeholder, value)
    agent = plistlib.loads(template.encode())
    agent["ProgramArguments"] = command
    agent["EnvironmentVariables"]["FARM_DATA"] = str(farm_home)
    path = home / "Library" / "LaunchAgents" / f"{LABEL}.plist"
    domain = f"gui/{os.getuid()}"
    activate = [["launchctl", "bootout", f"{domain}/{LABEL}"], ["launchctl", "bootstrap", domain, str(path)],
                ["launchctl", "kickstart", "-k", f"{domain}/{LABEL}"]]
    return ServiceUnit(path, plistlib.dumps(agent).decode(), activate)


def systemd_user_unit(farm_home: Path, command: list[str], home: Path) -> ServiceUnit:
    """ops/systemd's worker user unit with `command` as ExecStart, for $XDG_CONFIG_HOME/systemd/user."""
    template = (OPS / "systemd" / SYSTEMD_UNIT).read_text()
    text = template.replace("__FARM_HOME__", str(farm_home)).replace("__JOIN_COMMAND__", shlex.join(command))
    config = Path(os.environ.get("XDG_CONFIG_HOME") or home / ".config")
    path = config / "systemd" / "user" / SYSTEMD_UNIT
    activate = [["systemctl", "--user", "daemon-reload"], ["systemctl", "--user", "enable", "--now", SYSTEMD_UNIT]]
    return ServiceUnit(path, text, activate)
