"""A throwaway PostgreSQL server for tests: ``initdb`` into a temporary folder, ``pg_ctl start`` on 127.0.0.1 at a
free port with password authentication, a fresh database per test, everything stopped and removed afterwards.

The server binaries come from the distribution (Debian: ``apt-get install postgresql``, found under
``/usr/lib/postgresql/<version>/bin``, or on ``PATH``). PostgreSQL refuses to run as root, so as root the
server runs as the ``postgres`` user (``runuser``); as any other user it runs as that user. Where no server can
be started the tests that need one are skipped with the reason; with ``CI`` set they fail instead, since CI
installs the server (``.ci/run``).
"""

from __future__ import annotations

import os
import pwd
import secrets
import shutil
import socket
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional

import pytest

USER = "postgres"


@dataclass
class Server:
    host: str
    port: int
    user: str
    password: str
    bin: Path
    run_as: list[str]

    def url(self, database: str) -> str:
        return f"postgresql+psycopg2://{self.user}:{self.password}@{self.host}:{self.port}/{database}"

    def run(self, tool: str, *args: str) -> None:
        env = dict(os.environ, PGPASSWORD=self.password)
        subprocess.run(
            [*self.run_as, str(self.bin / tool), "-h", self.host, "-p", str(self.port), "-U", self.user, *args],
            check=True,
            capture_output=True,
            env=env,
            timeout=60,
        )


def _server_bin() -> Optional[Path]:
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=lambda p: int(p.parts[-3]))
    if found:
        return found[-1].parent
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


def _unavailable(reason: str) -> None:
    message = f"no PostgreSQL server can be started here: {reason}"
    if os.environ.get("CI"):
        pytest.fail(f"{message} (CI installs one: see .ci/run)")
    pytest.skip(message)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def postgres_server(tmp_path_factory) -> Iterator[Server]:
    """One server for the session (a cluster takes seconds to create)."""
    try:
        import psycopg2  # noqa: F401  (the driver Optuna's storage will use)
    except ImportError:
        _unavailable("the psycopg2 driver is missing (pip install -e '.[postgres]')")
    bin_dir = _server_bin()
    if bin_dir is None:
        _unavailable("initdb not found (Debian: apt-get install postgresql)")
    run_as: list[str] = []
    if os.geteuid() == 0:
        if shutil.which("runuser") is None:
            _unavailable("running as root without runuser to start the server as user postgres")
        try:
            account = pwd.getpwnam(USER)
        except KeyError:
            _unavailable("running as root and there is no 'postgres' user to run the server")
        run_as = ["runuser", "-u", USER, "--"]
    root = Path(tempfile.mkdtemp(prefix="linformer-lab-pg-"))
    if run_as:
        os.chown(root, account.pw_uid, account.pw_gid)
    password = secrets.token_urlsafe(12)
    (root / "pw").write_text(password + "\n")
    if run_as:
        os.chown(root / "pw", account.pw_uid, account.pw_gid)
    server = Server("127.0.0.1", _free_port(), USER, password, bin_dir, run_as)
    data, log = root / "data", root / "server.log"

    def as_server(tool: str, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([*run_as, str(bin_dir / tool), *args], capture_output=True, text=True, timeout=120)

    started = False
    try:
        init = as_server("initdb", "-D", str(data), "-U", USER, "--auth=scram-sha-256", f"--pwfile={root / 'pw'}")
        if init.returncode != 0:
            _unavailable(f"initdb failed: {(init.stderr or init.stdout).strip().splitlines()[-1]}")
        start = as_server(
            "pg_ctl",
            "-D",
            str(data),
            "-l",
            str(log),
            "-w",
            "-t",
            "60",
            "start",
            "-o",
            f"-p {server.port} -k {root} -c listen_addresses=127.0.0.1 -c max_connections=100",
        )
        started = start.returncode == 0
        if not started:
            tail = log.read_text().strip().splitlines()[-1:] if log.is_file() else []
            _unavailable(f"pg_ctl start failed: {(tail or [start.stderr.strip()])[0]}")
        yield server
    finally:
        if started:
            as_server("pg_ctl", "-D", str(data), "-m", "immediate", "stop")
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def postgres_url(postgres_server: Server) -> Iterator[str]:
    """URL (with its password) of a fresh, empty database on the session's server."""
    database = f"t_{secrets.token_hex(6)}"
    postgres_server.run("createdb", database)
    yield postgres_server.url(database)
    postgres_server.run("dropdb", "--force", database)
