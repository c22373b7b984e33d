"""wrk (Debian's ``wrk``: ``apt-get install -y wrk``) driven by a generated Lua script.

The script pre-formats one request per key (1,000 distinct keys) in ``init`` and walks over
them, each wrk thread from its own offset; ``done`` prints the summary as one JSON line.
Latency percentiles are wrk's (per request, over the whole run).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

INSTALL_HINT = "apt-get install -y wrk"

_LUA = r"""
local specs = {%(specs)s}
local reqs = {}
local idx = 0
local thread_no = 0
setup = function(thread)
  thread:set("offset", thread_no * 997)
  thread_no = thread_no + 1
end
init = function(args)
  for i, s in ipairs(specs) do
    reqs[i] = wrk.format(s[1], s[2], s[3], s[4])
  end
  idx = (offset or 0) %% #reqs
end
request = function()
  idx = idx %% #reqs + 1
  return reqs[idx]
end
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    '\nWRKJSON {"requests":%%d,"duration_us":%%d,"bytes":%%d,"connect":%%d,"read":%%d,' ..
    '"write":%%d,"status":%%d,"timeout":%%d,' ..
    '"p50_us":%%d,"p90_us":%%d,"p99_us":%%d,"mean_us":%%f}\n',
    summary.requests, summary.duration, summary.bytes, e.connect, e.read, e.write, e.status,
    e.timeout, latency:percentile(50), latency:percentile(90), latency:percentile(99),
    latency.mean))
end
"""


def find() -> str | None:
    return shutil.which("wrk")


def _lua_str(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def script(requests: list[tuple[str, str, dict[str, str], str | None]], path: Path) -> Path:
    """requests: (method, path, headers, body or None)."""
    specs = []
    for method, url_path, headers, body in requests:
        hdrs = "{" + ", ".join(f"[{_lua_str(k)}] = {_lua_str(v)}" for k, v in headers.items()) + "}"
        specs.append(
            f"{{{_lua_str(method)}, {_lua_str(url_path)}, {hdrs}, "
            f"{_lua_str(body) if body is not None else 'nil'}}}"
        )
    path.write_text(_LUA % {"specs": ",\n".join(specs)})
    return path


def run(
    binary: str,
    url: str,
    lua: Path,
    *,
    threads: int,
    connections: int,
    duration: float,
    timeout: float = 5.0,
) -> dict:
    args = [
        binary,
        f"-t{threads}",
        f"-c{connections}",
        f"-d{max(1, round(duration))}s",
        f"--timeout={int(timeout)}s",
        "-s",
        str(lua),
        url,
    ]
    out = subprocess.run(args, check=False, capture_output=True, text=True, timeout=duration + 60)
    for line in reversed(out.stdout.splitlines()):
        if line.startswith("WRKJSON "):
            data = json.loads(line[len("WRKJSON ") :])
            seconds = data["duration_us"] / 1e6
            errors = data["connect"] + data["read"] + data["write"] + data["timeout"]
            return {
                "ops": data["requests"],
                "seconds": seconds,
                "rate": (data["requests"] - data["status"]) / seconds if seconds else 0.0,
                "errors": errors,
                "non_2xx": data["status"],
                "p50_ms": data["p50_us"] / 1000,
                "p90_ms": data["p90_us"] / 1000,
                "p99_ms": data["p99_us"] / 1000,
                "mean_ms": data["mean_us"] / 1000,
                "threads": threads,
                "connections": connections,
            }
    raise RuntimeError(
        f"wrk gave no summary (exit {out.returncode}): {(out.stderr or out.stdout)[-300:]}"
    )
