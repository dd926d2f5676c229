#!/usr/bin/env python3
"""Run examples/flower as a deployment on this machine: a SuperLink and N SuperNodes as separate
processes talking gRPC/HTTPS over TLS on loopback, the app submitted with ``flwr run``.

    python examples/flower/deploy_local.py --supernodes 3 --rounds 2 --json deploy.json

What it does, in order (README.md, "Deployment", gives the same steps by hand for two machines):

1. A temporary folder with a certificate authority and the SuperLink's certificate for 127.0.0.1
   (the ``cryptography`` package), and with SuperNode authentication an EC P-384 key pair per SuperNode.
2. ``flower-superlink`` (not ``--simulation``) on 127.0.0.1 with ``--ssl-certfile/--ssl-keyfile/
   --ssl-ca-certfile`` and ``--enable-supernode-auth``; its state in the temporary folder.
3. ``flwr supernode register`` of each SuperNode's public key (over the SuperLink's Control API, TLS).
4. N ``flower-supernode --superlink 127.0.0.1:PORT --root-certificates ca.pem --auth-supernode-private-key
   ... --node-config "partition-id=i num-partitions=N"``: each trains on its own partition.
5. ``flwr run examples/flower local --stream`` once every SuperNode is online; the ServerApp writes the
   rounds' bytes (``traffic-json``).
6. Every process it started is stopped by its pid (its process group: the SuperExec and app processes
   they spawned), also on error, timeout or Ctrl-C; then it checks that none is left.

OUT (``--json``): ``{"tls": true, "supernode_auth": true, "superlink": "127.0.0.1:PORT", "pids": [...],
"left_behind": [], "seconds": ..., "rounds": [{"round": 1, "bytes_up": ..., "bytes_up_uncompressed":
..., "bytes_down": ..., ...}]}``.  Exit status 0 when the run ended and every process was stopped.
Needs Flower (``pip install 'mucsc[flower]'``), torch and scikit-learn; loopback only, no network.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

APP = Path(__file__).resolve().parent
ROOT = APP.parents[1]          # the mucsc checkout (its package is imported by Flower's processes)
HOST = "127.0.0.1"
BIN = Path(sys.executable).parent


class DeployError(RuntimeError):
    """A step of the deployment failed; the message names it (and the log lines that say why)."""


# ---- certificates and keys -----------------------------------------------------------------------

def make_certificates(folder: Path) -> dict[str, Path]:
    """A CA and the SuperLink's certificate (127.0.0.1, localhost) signed by it, as PEM files."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.timezone.utc)

    def name(cn: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])

    def save_key(key: Any, path: Path) -> None:
        path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
        path.chmod(0o600)

    ca_key = ec.generate_private_key(ec.SECP384R1())
    ca = (x509.CertificateBuilder().subject_name(name("mucsc deploy_local CA")).issuer_name(name("mucsc deploy_local CA"))
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP384R1())
    import ipaddress
    cert = (x509.CertificateBuilder().subject_name(name("localhost")).issuer_name(ca.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                        x509.IPAddress(ipaddress.ip_address(HOST))]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .sign(ca_key, hashes.SHA256()))
    paths = {"ca": folder / "ca.pem", "cert": folder / "server.pem", "key": folder / "server.key"}
    paths["ca"].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths["cert"].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    save_key(key, paths["key"])
    return paths


def make_node_keys(folder: Path, n: int) -> list[tuple[Path, Path]]:
    """(private, public) EC P-384 key files in OpenSSH format, one pair per SuperNode."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    out = []
    for i in range(n):
        key = ec.generate_private_key(ec.SECP384R1())
        private, public = folder / f"node{i}", folder / f"node{i}.pub"
        private.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                              serialization.NoEncryption()))
        private.chmod(0o600)
        public.write_bytes(key.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                                         serialization.PublicFormat.OpenSSH))
        out.append((private, public))
    return out


# ---- processes -----------------------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def command(name: str) -> str:
    """A Flower command beside this Python (a venv started by path) or on PATH."""
    found = shutil.which(name, path=str(BIN)) or shutil.which(name)
    if found is None:
        raise DeployError(f"{name} not found beside {sys.executable} or on PATH: pip install 'mucsc[flower]'")
    return found


class Processes:
    """The processes this script started, each in its own session, and everything they spawn (Flower's
    SuperExec starts its app processes in sessions of their own): ``stop`` ends them all by pid, and
    ``left`` lists any still alive."""

    def __init__(self, folder: Path, env: dict[str, str]) -> None:
        self.folder, self.env = folder, env
        self.procs: list[tuple[str, subprocess.Popen]] = []
        self.seen: dict[int, int] = {}  # pid -> start time of every descendant seen so far
        self.sessions: set[int] = set()

    def start(self, name: str, args: list[str]) -> subprocess.Popen:
        log = open(self.folder / f"{name}.log", "wb")
        proc = subprocess.Popen(args, env=self.env, stdout=log, stderr=subprocess.STDOUT, cwd=self.folder,
                                start_new_session=True)
        log.close()
        self.procs.append((name, proc))
        return proc

    @property
    def pids(self) -> list[int]:
        return [p.pid for _, p in self.procs]

    def stop(self, grace: float = 20.0) -> None:
        """SIGTERM to each started process's group and to every process of theirs (descendants, and the
        sessions those opened), SIGKILL to whatever is alive after ``grace``."""
        self.left()  # the tree as it is now, before parents die and orphans lose their link
        for _, p in self.procs:
            _signal_group(p.pid, signal.SIGTERM)
        for pid in self.left():
            _signal(pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while self.left() and time.monotonic() < deadline:
            time.sleep(0.2)
        for pid in self.left():
            _signal(pid, signal.SIGKILL)
        for _, p in self.procs:
            if p.poll() is None:
                p.wait()
        end = time.monotonic() + 5.0
        while self.left() and time.monotonic() < end:  # SIGKILLed processes take a moment to be reaped
            time.sleep(0.2)

    def left(self) -> list[int]:
        """Processes of ours still alive: the started ones, their descendants (remembered across calls,
        so an orphan still counts), and any process in a session one of them opened."""
        table = _process_table()
        children: dict[int, list[int]] = {}
        for pid, (ppid, _sid, _start) in table.items():
            children.setdefault(ppid, []).append(pid)
        todo = [pid for pid in self.pids if pid in table]
        while todo:
            pid = todo.pop()
            if pid not in self.seen:
                self.seen[pid] = table[pid][2]
                self.sessions.add(table[pid][1])
            todo += [c for c in children.get(pid, []) if c not in self.seen]
        for pid, (_ppid, sid, start) in table.items():
            if sid in self.sessions and pid not in self.seen:
                self.seen[pid] = start
        return sorted(pid for pid, start in self.seen.items() if pid in table and table[pid][2] == start)

    def tail(self, name: str, lines: int = 15) -> str:
        try:
            text = (self.folder / f"{name}.log").read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:
            return "(no log)"
        return "\n".join(text[-lines:])


def _process_table() -> dict[int, tuple[int, int, int]]:
    """pid -> (parent pid, session id, start time) of every live (not zombie) process, from /proc."""
    out = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(") ", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] != "Z":  # state, ppid, pgrp, session, ..., starttime (field 22)
            out[int(entry)] = (int(fields[1]), int(fields[3]), int(fields[19]))
    return out


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def wait_healthy(address: str, ca: Path, proc: subprocess.Popen, procs: Processes, timeout: float) -> None:
    """The SuperLink answers /health over HTTPS with a certificate the CA signed."""
    ctx = ssl.create_default_context(cafile=str(ca))
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(f"https://{address}/health", timeout=2, context=ctx) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        if proc.poll() is not None:
            raise DeployError(f"flower-superlink exited with {proc.returncode}:\n{procs.tail('superlink')}")
        if time.monotonic() > deadline:
            raise DeployError(f"flower-superlink not healthy after {timeout:.0f} s:\n{procs.tail('superlink')}")
        time.sleep(0.3)


def flwr(args: list[str], env: dict[str, str], timeout: float, cwd: Path) -> str:
    proc = subprocess.run([command("flwr"), *args], env=env, capture_output=True, text=True, timeout=timeout,
                          cwd=cwd)
    if proc.returncode != 0:
        raise DeployError(f"flwr {' '.join(args[:2])} exited with {proc.returncode}:\n"
                          f"{(proc.stdout + proc.stderr)[-3000:]}")
    return proc.stdout


def wait_online(n: int, env: dict[str, str], cwd: Path, procs: Processes, timeout: float) -> None:
    """Every SuperNode shows as online in ``flwr supernode ls``."""
    deadline = time.monotonic() + timeout
    online = 0
    while time.monotonic() < deadline:
        for name, p in procs.procs:
            if name.startswith("supernode") and p.poll() is not None:
                raise DeployError(f"{name} exited with {p.returncode}:\n{procs.tail(name)}")
        out = flwr(["supernode", "ls", "local", "--format", "json"], env, 60, cwd)
        nodes = json.loads(out[out.index("{"):]).get("nodes", []) if "{" in out else []
        online = sum(1 for node in nodes if node.get("status") == "online")
        if online >= n:
            return
        time.sleep(1.0)
    raise DeployError(f"only {online} of {n} SuperNodes online after {timeout:.0f} s")


# ---- the deployment ------------------------------------------------------------------------------

def deploy(supernodes: int, rounds: int, folder: Path, timeout: float, auth: bool,
           result: dict[str, Any]) -> None:
    """The deployment; ``result`` (the report) is filled as it goes, so that it holds the pids and what
    was left behind also when a step fails."""
    certs = make_certificates(folder)
    home = folder / "flwr-home"
    home.mkdir()
    env = dict(os.environ)
    env.update(FLWR_HOME=str(home), FLWR_TELEMETRY_ENABLED="0", FLWR_DISABLE_UPDATE_CHECK="1",
               FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION="1",
               PATH=os.pathsep.join([str(BIN), env.get("PATH", "")]),
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")])))
    port = free_port()
    address = f"{HOST}:{port}"
    (home / "config.toml").write_text(
        f'[superlink]\ndefault = "local"\n\n[superlink.local]\naddress = "{address}"\n'
        f'root-certificates = "{certs["ca"]}"\n', encoding="utf-8")
    procs = Processes(folder, env)
    t0 = time.monotonic()
    result.update(tls=True, supernode_auth=auth, superlink=address, pids=procs.pids)
    try:
        link = procs.start("superlink", [
            command("flower-superlink"), "--ssl-certfile", str(certs["cert"]), "--ssl-keyfile", str(certs["key"]),
            "--ssl-ca-certfile", str(certs["ca"]), "--host", HOST, "--port", str(port),
            "--database", str(folder / "superlink.db"), "--disable-runtime-dependency-installation",
            *(["--enable-supernode-auth"] if auth else [])])
        wait_healthy(address, certs["ca"], link, procs, timeout=120)
        keys = make_node_keys(folder, supernodes) if auth else []
        for _, public in keys:
            flwr(["supernode", "register", str(public), "local"], env, 60, folder)
        for i in range(supernodes):
            procs.start(f"supernode{i}", [
                command("flower-supernode"), "--superlink", address, "--root-certificates", str(certs["ca"]),
                "--host", HOST, "--port", str(free_port()),
                "--node-config", f"partition-id={i} num-partitions={supernodes}",
                *(["--auth-supernode-private-key", str(keys[i][0])] if auth else [])])
        result["pids"] = procs.pids
        wait_online(supernodes, env, folder, procs, timeout=120)
        traffic = folder / "traffic.json"
        run_config = (f"num-server-rounds={rounds} fraction-train=1.0 fraction-evaluate=0.0 "
                      f"traffic-json={json.dumps(str(traffic))}")
        left = max(30.0, timeout - (time.monotonic() - t0))
        code, output = run_app(run_config, env, folder, procs, left)
        if code != 0 or not traffic.exists():
            raise DeployError(f"flwr run exited with {code}"
                              f"{'' if traffic.exists() else ' without the rounds bytes'}:\n{output[-3000:]}")
        result["rounds"] = json.loads(traffic.read_text(encoding="utf-8"))
        text = re.sub(r"\x1b\[[0-9;]*m", "", output)  # Flower's log colours
        result["summary"] = [line[line.index("mucsc "):] for line in text.splitlines()
                             if "mucsc train uplink" in line or "mucsc train downlink" in line]
    finally:
        procs.stop()
        result["left_behind"] = procs.left()
        result["seconds"] = round(time.monotonic() - t0, 1)


def run_app(run_config: str, env: dict[str, str], folder: Path, procs: Processes, timeout: float) -> tuple[int, str]:
    """``flwr run APP local --stream`` -> (exit status, output); the process tree is noted every
    second meanwhile (so that app processes whose parents exit are still ours to stop)."""
    log = folder / "flwr-run.log"
    with open(log, "wb") as sink:
        run = subprocess.Popen([command("flwr"), "run", str(APP), "local", "--stream", "-c", run_config],
                               env=env, stdout=sink, stderr=subprocess.STDOUT, cwd=folder, start_new_session=True)
        procs.procs.append(("flwr-run", run))
        deadline = time.monotonic() + timeout
        while run.poll() is None:
            procs.left()
            if time.monotonic() > deadline:
                raise DeployError(f"flwr run did not end within {timeout:.0f} s:\n{procs.tail('superlink')}")
            time.sleep(1.0)
    return run.returncode, log.read_text(encoding="utf-8", errors="replace")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--supernodes", type=int, default=3, help="SuperNodes to start (each its own partition) [3]")
    ap.add_argument("--rounds", type=int, default=2, help="FedAvg rounds [2]")
    ap.add_argument("--json", type=Path, help="write the report here (see the module docstring)")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds for the whole deployment [600]")
    ap.add_argument("--no-auth", dest="auth", action="store_false", help="without SuperNode authentication")
    ap.add_argument("--keep", action="store_true", help="keep the temporary folder (certificates, logs)")
    args = ap.parse_args(argv)
    if args.supernodes < 1 or args.rounds < 1:
        ap.error("--supernodes and --rounds must be >= 1")
    folder = Path(tempfile.mkdtemp(prefix="mucsc-deploy-"))
    code = 0
    result: dict[str, Any] = {"tls": True}
    try:
        deploy(args.supernodes, args.rounds, folder, args.timeout, args.auth, result)
    except (DeployError, OSError, subprocess.SubprocessError) as exc:
        print(f"deploy_local: error: {exc}", file=sys.stderr)
        result["error"], code = str(exc), 1
    except KeyboardInterrupt:
        result["error"], code = "interrupted", 130
    finally:
        if args.keep:
            print(f"deploy_local: files kept in {folder}", file=sys.stderr)
        else:
            shutil.rmtree(folder, ignore_errors=True)
    if result.get("left_behind"):
        print(f"deploy_local: error: processes left behind: {result['left_behind']}", file=sys.stderr)
        code = code or 1
    text = json.dumps(result, indent=2)
    if args.json is not None:
        tmp = args.json.with_name(args.json.name + ".part")
        tmp.write_text(text + "\n", encoding="utf-8")
        os.replace(tmp, args.json)
    else:
        print(text)
    return code


if __name__ == "__main__":
    sys.exit(main())
