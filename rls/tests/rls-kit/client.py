#!/usr/bin/env python3
"""Foreign-client conformance runner for an Envoy RLS v3 server (envoyproxy/ratelimit drop-in).

Replays cases/*.yaml (see cases/README.md) over gRPC (grpcio + xds-protos) or over HTTP POST /json
(stdlib only), and checks gRPC / HTTP health. Exit status: 0 all passed, 1 any mismatch, 2 usage error.

Examples
  # server already running with the case's config loaded:
  client.py --addr 127.0.0.1:8081 --debug-addr 127.0.0.1:6070 cases/it02_basic_key1_second.yaml
  # launch a fresh server per case/variant (recommended; configs + env come from the case):
  client.py --server-cmd '/path/to/server-binary' --server-env BACKEND_TYPE=memory cases/
  # same cases over HTTP /json:
  client.py --mode json --http-addr 127.0.0.1:8080 --debug-addr 127.0.0.1:6070 cases/
  # health:
  client.py --health --addr 127.0.0.1:8081 [--http-addr 127.0.0.1:8080]

Test-clock contract (the server's test mode must implement it; see README.md):
  POST http://<debug addr>/test/clock?now_unix=<n>  -> 2xx; afterwards the server's rate-limit clock
  reads exactly <n> (frozen) until the next such call.
"""
import argparse
import json
import os
import random
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

import yaml  # PyYAML: case files are YAML

DIV = {"SECOND": 1, "MINUTE": 60, "HOUR": 3600, "DAY": 86400, "WEEK": 604800,
       "MONTH": 2592000, "YEAR": 31536000}
HEALTH_STATUS = {0: "UNKNOWN", 1: "SERVING", 2: "NOT_SERVING", 3: "SERVICE_UNKNOWN"}


# ----------------------------------------------------------------------------- case loading
def load_cases(paths):
    files = []
    for p in paths:
        if os.path.isdir(p):
            files += sorted(os.path.join(p, f) for f in os.listdir(p)
                            if f.endswith((".yaml", ".yml")) and not f.startswith("_"))
        else:
            files.append(p)
    cases = []
    for f in files:
        with open(f) as fh:
            c = yaml.safe_load(fh)
        if not isinstance(c, dict) or "steps" not in c:
            continue
        c["_file"] = f
        cases.append(c)
    return cases


def subst(obj, vars_):
    if isinstance(obj, str):
        for k, v in vars_.items():
            obj = obj.replace("${" + k + "}", v)
        return obj
    if isinstance(obj, list):
        return [subst(x, vars_) for x in obj]
    if isinstance(obj, dict):
        return {k: subst(v, vars_) for k, v in obj.items()}
    return obj


# ----------------------------------------------------------------------------- normalisation
def norm_grpc_response(resp, rls_pb2):
    Code = rls_pb2.RateLimitResponse.Code
    Unit = rls_pb2.RateLimitResponse.RateLimit.Unit
    out = {"overall_code": Code.Name(resp.overall_code), "statuses": []}
    for s in resp.statuses:
        d = {"code": Code.Name(s.code), "limit_remaining": s.limit_remaining}
        if s.HasField("current_limit"):
            cl = {"requests_per_unit": s.current_limit.requests_per_unit, "unit": Unit.Name(s.current_limit.unit)}
            if s.current_limit.name:
                cl["name"] = s.current_limit.name
            d["current_limit"] = cl
        else:
            d["current_limit"] = None
        if s.HasField("duration_until_reset"):
            d["duration_until_reset"] = s.duration_until_reset.seconds
            if s.duration_until_reset.nanos:
                d["duration_nanos"] = s.duration_until_reset.nanos
        else:
            d["duration_until_reset"] = None
        if s.HasField("quota"):
            d["quota"] = "set"
        out["statuses"].append(d)
    if len(resp.response_headers_to_add):
        out["response_headers_to_add"] = [(h.key, h.value) for h in resp.response_headers_to_add]
    return out


def norm_json_response(body):
    """protojson RateLimitResponse -> same normal form (zero values are omitted by protojson)."""
    out = {"overall_code": body.get("overallCode", "UNKNOWN"), "statuses": []}
    for s in body.get("statuses", []):
        d = {"code": s.get("code", "UNKNOWN"), "limit_remaining": int(s.get("limitRemaining", 0))}
        cl = s.get("currentLimit")
        if cl is not None:
            c = {"requests_per_unit": int(cl.get("requestsPerUnit", 0)), "unit": cl.get("unit", "UNKNOWN")}
            if cl.get("name"):
                c["name"] = cl["name"]
            d["current_limit"] = c
        else:
            d["current_limit"] = None
        dur = s.get("durationUntilReset")
        if dur is None:
            d["duration_until_reset"] = None
        else:
            if not (isinstance(dur, str) and dur.endswith("s")):
                d["duration_until_reset"] = f"bad duration {dur!r}"
            else:
                v = float(dur[:-1])
                d["duration_until_reset"] = int(v)
                if v != int(v):
                    d["duration_nanos"] = round((v - int(v)) * 1e9)
        out["statuses"].append(d)
    if body.get("responseHeadersToAdd"):
        out["response_headers_to_add"] = [(h.get("key"), h.get("value")) for h in body["responseHeadersToAdd"]]
    return out


def compare(expect, got, clock_pinned):
    """Return a list of human-readable mismatches."""
    errs = []
    if got.get("overall_code") != expect["overall_code"]:
        errs.append(f"overall_code: want {expect['overall_code']} got {got.get('overall_code')}")
    es, gs = expect["statuses"], got.get("statuses", [])
    if len(es) != len(gs):
        errs.append(f"statuses: want {len(es)} entries got {len(gs)}")
    for i, (e, g) in enumerate(zip(es, gs)):
        p = f"statuses[{i}]"
        if g["code"] != e["code"]:
            errs.append(f"{p}.code: want {e['code']} got {g['code']}")
        if g["limit_remaining"] != e["limit_remaining"]:
            errs.append(f"{p}.limit_remaining: want {e['limit_remaining']} got {g['limit_remaining']}")
        ecl, gcl = e.get("current_limit"), g.get("current_limit")
        if ecl is None and gcl is not None:
            errs.append(f"{p}.current_limit: want unset got {gcl}")
        elif ecl is not None and gcl != ecl:
            errs.append(f"{p}.current_limit: want {ecl} got {gcl}")
        ed, gd = e.get("duration_until_reset"), g.get("duration_until_reset")
        if g.get("duration_nanos"):
            errs.append(f"{p}.duration_until_reset.nanos: want 0 got {g['duration_nanos']}")
        if ed is None:
            if gd is not None:
                errs.append(f"{p}.duration_until_reset: want unset got {gd}s")
        elif gd is None or not isinstance(gd, int):
            errs.append(f"{p}.duration_until_reset: want {ed} got {gd}")
        else:
            if "seconds" in ed and clock_pinned:
                if gd != ed["seconds"]:
                    errs.append(f"{p}.duration_until_reset: want {ed['seconds']}s got {gd}s")
            else:
                lo, hi = ed["range"] if "range" in ed else (1, DIV[(ecl or {}).get("unit", "YEAR")])
                if not lo <= gd <= hi:
                    errs.append(f"{p}.duration_until_reset: want {lo}..{hi}s got {gd}s")
        if "quota" in g:
            errs.append(f"{p}.quota: want unset got set")
    if "response_headers_to_add" in got and "response_headers_to_add" not in expect:
        errs.append(f"response_headers_to_add: want none got {got['response_headers_to_add']}")
    return errs


# ----------------------------------------------------------------------------- transports
class GrpcTransport:
    def __init__(self, addr, timeout):
        import grpc  # noqa: F401  (grpcio)
        from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
        from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc
        from envoy.type.v3 import ratelimit_unit_pb2
        self.grpc, self.rls_pb2, self.desc_pb2, self.unit_pb2 = grpc, rls_pb2, ratelimit_pb2, ratelimit_unit_pb2
        self.channel = grpc.insecure_channel(addr)
        self.stub = rls_pb2_grpc.RateLimitServiceStub(self.channel)
        self.timeout = timeout

    def build(self, r):
        req = self.rls_pb2.RateLimitRequest(domain=r.get("domain", ""), hits_addend=int(r.get("hits_addend", 0)))
        for d in r.get("descriptors", []):
            desc = req.descriptors.add()
            for k, v in d.get("entries", []):
                desc.entries.add(key=str(k), value=str(v))
            if "limit" in d:
                desc.limit.requests_per_unit = int(d["limit"]["requests_per_unit"])
                desc.limit.unit = self.unit_pb2.RateLimitUnit.Value(d["limit"]["unit"])
            if "hits_addend" in d:
                desc.hits_addend.value = int(d["hits_addend"])
        return req

    def call(self, r):
        try:
            resp = self.stub.ShouldRateLimit(self.build(r), timeout=self.timeout)
        except self.grpc.RpcError as e:
            return {"error": {"grpc_code": e.code().name, "message": e.details()}}
        return norm_grpc_response(resp, self.rls_pb2)

    def close(self):
        self.channel.close()


class JsonTransport:
    """HTTP POST /json with protojson bodies; stdlib only."""

    def __init__(self, http_addr, timeout):
        self.url = f"http://{http_addr}/json"
        self.timeout = timeout

    @staticmethod
    def build(r):
        body = {"domain": r.get("domain", "")}
        descs = []
        for d in r.get("descriptors", []):
            j = {"entries": [{"key": str(k), "value": str(v)} for k, v in d.get("entries", [])]}
            if "limit" in d:
                j["limit"] = {"requestsPerUnit": int(d["limit"]["requests_per_unit"]), "unit": d["limit"]["unit"]}
            if "hits_addend" in d:
                j["hitsAddend"] = str(int(d["hits_addend"]))  # google.protobuf.UInt64Value -> JSON string
            descs.append(j)
        body["descriptors"] = descs
        if r.get("hits_addend"):
            body["hitsAddend"] = int(r["hits_addend"])
        return json.dumps(body).encode()

    def call(self, r):
        req = urllib.request.Request(self.url, data=self.build(r), method="POST",
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                status, ctype, raw = resp.status, resp.headers.get("Content-Type", ""), resp.read()
        except urllib.error.HTTPError as e:
            status, ctype, raw = e.code, e.headers.get("Content-Type", ""), e.read()
        except (urllib.error.URLError, OSError) as e:
            return {"error": {"http_status": None, "message": str(e)}}
        if status == 400 or status >= 500 and not ctype.startswith("application/json"):
            return {"error": {"http_status": status, "message": raw.decode(errors="replace")}}
        try:
            body = json.loads(raw)
        except ValueError:
            return {"error": {"http_status": status, "message": f"non-JSON body {raw[:200]!r}"}}
        out = norm_json_response(body)
        out["_http_status"] = status
        out["_content_type"] = ctype
        return out

    def close(self):
        pass


# ----------------------------------------------------------------------------- clock / health
def set_clock(debug_addr, now, timeout):
    url = f"http://{debug_addr}/test/clock?now_unix={int(now)}"
    req = urllib.request.Request(url, data=b"", method="POST")
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        if not 200 <= resp.status < 300:
            raise RuntimeError(f"clock hook {url} -> HTTP {resp.status}")


def _health_req(service):
    b = service.encode()
    if not b:
        return b""
    n, out = len(b), bytearray([0x0A])
    while True:  # varint length
        if n < 0x80:
            out.append(n)
            break
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    return bytes(out) + b


def _health_status(raw):
    # HealthCheckResponse { ServingStatus status = 1; } ; absent field = UNKNOWN(0)
    if len(raw) >= 2 and raw[0] == 0x08:
        return HEALTH_STATUS.get(raw[1], str(raw[1]))
    return "UNKNOWN"


def grpc_health(addr, service, timeout):
    import grpc
    with grpc.insecure_channel(addr) as ch:
        check = ch.unary_unary("/grpc.health.v1.Health/Check")  # raw bytes in/out
        try:
            return _health_status(check(_health_req(service), timeout=timeout))
        except grpc.RpcError as e:
            return f"RPC error {e.code().name}: {e.details()}"


def run_health(args):
    ok = True
    for svc in ("", "ratelimit"):
        st = grpc_health(args.addr, svc, args.timeout)
        good = st == "SERVING"
        ok &= good
        print(f"grpc.health.v1.Health/Check service={svc!r}: {st} [{'ok' if good else 'MISMATCH'}]")
    if args.http_addr:
        try:
            with urllib.request.urlopen(f"http://{args.http_addr}/healthcheck", timeout=args.timeout) as r:
                code, body = r.status, r.read()
        except urllib.error.HTTPError as e:
            code, body = e.code, e.read()
        except OSError as e:
            code, body = None, str(e).encode()
        good = code == 200 and body == b"OK"
        ok &= good
        verdict = "ok" if good else "MISMATCH (want 200, body OK)"
        print(f"GET /healthcheck: {code} {body!r} [{verdict}]")
    return 0 if ok else 1


# ----------------------------------------------------------------------------- server launch
def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LaunchedServer:
    def __init__(self, cmd, case, variant, extra_env, timeout, log_dir):
        self.root = tempfile.mkdtemp(prefix=f"rlskit-{case['id']}-")
        for f in case["runtime"]["files"]:
            p = os.path.join(self.root, f["path"])
            os.makedirs(os.path.dirname(p), exist_ok=True)
            with open(p, "w") as fh:
                fh.write(f["content"])
        self.log = os.path.join(log_dir, f"{case['id']}.{variant['name']}.log")
        # A port found free may be taken by another test before the server
        # binds it (tests run in parallel): then start again on new ports.
        for attempt in range(5):
            if self._start(cmd, case, variant, extra_env, timeout):
                return
        raise RuntimeError(f"no free ports after 5 attempts; log: {self.log}")

    def _start(self, cmd, case, variant, extra_env, timeout):
        self.grpc_port, self.http_port, self.debug_port = free_port(), free_port(), free_port()
        env = dict(os.environ)
        env.update({
            "RUNTIME_ROOT": self.root, "USE_STATSD": "false",  # as integration_test.go:35,56
            "GRPC_HOST": "127.0.0.1", "GRPC_PORT": str(self.grpc_port),
            "HOST": "127.0.0.1", "PORT": str(self.http_port),
            "DEBUG_HOST": "127.0.0.1", "DEBUG_PORT": str(self.debug_port),
        })
        env.update({k: str(v) for k, v in case["runtime"].get("env", {}).items()})
        env.update(extra_env)
        env.update({k: str(v) for k, v in case.get("env", {}).items()})
        env.update({k: str(v) for k, v in variant.get("env", {}).items()})
        self.env = env
        log = self.log
        self.logf = open(log, "w")
        self.proc = subprocess.Popen(shlex.split(cmd), env=env, stdout=self.logf, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                self.logf.close()
                with open(log) as fh:
                    if "Address already in use" in fh.read():
                        return False
                raise RuntimeError(f"server exited with {self.proc.returncode}; log: {log}")
            try:
                # Every listener, the debug one (the test clock) included.
                for port in (self.grpc_port, self.http_port, self.debug_port):
                    with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                        pass
                return True
            except OSError:
                time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"server did not listen within {timeout}s; log: {log}")

    @property
    def addrs(self):
        return (f"127.0.0.1:{self.grpc_port}", f"127.0.0.1:{self.http_port}", f"127.0.0.1:{self.debug_port}")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)  # only the process we started
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.logf.close()


# ----------------------------------------------------------------------------- replay
def run_case(case, variant, args, addr, http_addr, debug_addr, runtime_root):
    """Returns (n_pass, n_fail, skipped_reason)."""
    clock = case.get("clock", "optional")
    pinned = bool(debug_addr) and not args.no_clock
    if clock == "required" and not pinned:
        return 0, 0, "needs the test clock (--debug-addr) "
    vars_ = {}
    for k, v in (case.get("vars") or {}).items():
        vars_[k] = str(random.randrange(10 ** 12, 10 ** 13)) if v == "random" else str(v)
    vars_.update({k: str(v) for k, v in (variant.get("vars") or {}).items()})
    transport = JsonTransport(http_addr, args.timeout) if args.mode == "json" else GrpcTransport(addr, args.timeout)
    n_pass = n_fail = 0
    last_now = None
    try:
        for idx, st in enumerate(case["steps"], 1):
            st = subst(st, vars_)
            label = f"{case['id']}[{variant['name']}] step {idx} '{st.get('name', '')}'"
            action = st.get("action", "request")
            if action in ("write_config", "remove_config"):
                if not runtime_root:
                    print(f"SKIP {label}: needs --runtime-root or --server-cmd")
                    return n_pass, n_fail, "config change without runtime root"
                if action == "write_config":
                    p = os.path.join(runtime_root, st["file"]["path"])
                    os.makedirs(os.path.dirname(p), exist_ok=True)
                    with open(p, "w") as fh:
                        fh.write(st["file"]["content"])
                else:
                    os.remove(os.path.join(runtime_root, st["path"]))
                if args.verbose:
                    print(f"ok   {label}")
                continue
            if pinned and "now_unix" in st and st["now_unix"] != last_now:
                set_clock(debug_addr, st["now_unix"], args.timeout)
                last_now = st["now_unix"]
            ev = st.get("eventually")
            deadline = time.time() + (min(ev["timeout_s"], args.eventually_max) if ev else 0)
            while True:
                got = transport.call(st["request"])
                errs = check_step(st["expect"], got, pinned and "now_unix" in st, args.mode)
                if not errs or not ev or time.time() >= deadline:
                    break
                time.sleep(ev.get("interval_s", 1))
            if errs:
                n_fail += 1
                print(f"FAIL {label} ({st.get('provenance', '?')}; {st.get('cite', '')})")
                for e in errs:
                    print(f"       - {e}")
                if args.verbose:
                    print(f"       got: {json.dumps(got)}")
            else:
                n_pass += 1
                if args.verbose:
                    print(f"ok   {label}")
    finally:
        transport.close()
    return n_pass, n_fail, None


def check_step(expect, got, pinned, mode):
    if "error" in expect:
        want = expect["error"]
        if "error" not in got:
            return [f"want error {want}, got response {got}"]
        g = got["error"]
        errs = []
        if mode == "json":
            if g.get("http_status") != want.get("http_status"):
                errs.append(f"http status: want {want.get('http_status')} got {g.get('http_status')}")
        else:
            if g.get("grpc_code") != want.get("grpc_code"):
                errs.append(f"grpc code: want {want.get('grpc_code')} got {g.get('grpc_code')}")
            if want.get("message") and g.get("message") != want["message"]:
                errs.append(f"grpc message: want {want['message']!r} got {g.get('message')!r}")
        return errs
    if "error" in got:
        return [f"unexpected error {got['error']}"]
    errs = compare(expect, got, pinned)
    if mode == "json":
        want_http = 429 if expect["overall_code"] == "OVER_LIMIT" else 200
        if got.get("_http_status") != want_http:
            errs.append(f"http status: want {want_http} got {got.get('_http_status')}")
        if not got.get("_content_type", "").startswith("application/json"):
            errs.append(f"content-type: want application/json got {got.get('_content_type')!r}")
    return errs


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("cases", nargs="*", help="case files or directories (default: cases/ next to this script)")
    ap.add_argument("--addr", help="gRPC address HOST:PORT (upstream default port 8081)")
    ap.add_argument("--http-addr", help="HTTP address HOST:PORT for /json and /healthcheck (upstream 8080)")
    ap.add_argument("--debug-addr", help="debug HTTP address HOST:PORT serving POST /test/clock (upstream debug 6070)")
    ap.add_argument("--mode", choices=["grpc", "json"], default="grpc")
    ap.add_argument("--health", action="store_true", help="only check grpc.health.v1 ('' and 'ratelimit') and /healthcheck")
    ap.add_argument("--no-clock", action="store_true", help="never call the clock hook; exact durations become 1..divider")
    ap.add_argument("--runtime-root", help="RUNTIME_ROOT of a running server (for write_config/remove_config steps)")
    ap.add_argument("--server-cmd", help="launch this command per case+variant (env + config from the case)")
    ap.add_argument("--server-env", action="append", default=[], metavar="K=V", help="extra env for --server-cmd")
    ap.add_argument("--variant", action="append", help="only these variant names (default: all with --server-cmd, "
                                                       "else only the first/'default')")
    ap.add_argument("--start-timeout", type=float, default=20)
    ap.add_argument("--timeout", type=float, default=5, help="per-RPC/HTTP timeout (s)")
    ap.add_argument("--eventually-max", type=float, default=120, help="cap for steps' eventually.timeout_s")
    ap.add_argument("--fail-on-skip", action="store_true")
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args()

    if args.health:
        if not args.addr:
            ap.error("--health needs --addr")
        sys.exit(run_health(args))
    if not args.server_cmd:
        if args.mode == "grpc" and not args.addr:
            ap.error("--addr is required (or --server-cmd)")
        if args.mode == "json" and not args.http_addr:
            ap.error("--http-addr is required for --mode json (or --server-cmd)")
    paths = args.cases or [os.path.join(os.path.dirname(os.path.abspath(__file__)), "cases")]
    cases = load_cases(paths)
    extra_env = dict(kv.split("=", 1) for kv in args.server_env)
    log_dir = tempfile.mkdtemp(prefix="rlskit-logs-")

    tot_pass = tot_fail = tot_skip = 0
    for case in cases:
        variants = case.get("variants") or [{"name": "default", "env": {}, "vars": {}}]
        if args.variant:
            variants = [v for v in variants if v["name"] in args.variant]
        elif not args.server_cmd:
            variants = variants[:1]
        for variant in variants:
            srv = None
            try:
                if args.server_cmd:
                    srv = LaunchedServer(args.server_cmd, case, variant, extra_env, args.start_timeout, log_dir)
                    addr, http_addr, debug_addr = srv.addrs
                    root = srv.root
                else:
                    addr, http_addr, debug_addr, root = args.addr, args.http_addr, args.debug_addr, args.runtime_root
                    if variant.get("env") or case.get("env"):
                        print(f"note {case['id']}[{variant['name']}]: assumes the running server has env "
                              f"{ {**case.get('env', {}), **variant.get('env', {})} }")
                p, f, skip = run_case(case, variant, args, addr, http_addr, debug_addr, root)
            except Exception as e:  # connection refused, clock hook missing, server did not start ...
                p, f, skip = 0, 1, None
                print(f"FAIL {case['id']}[{variant['name']}]: {type(e).__name__}: {e}")
            finally:
                if srv:
                    srv.stop()
            tot_pass += p
            tot_fail += f
            if skip:
                tot_skip += 1
                print(f"SKIP {case['id']}[{variant['name']}]: {skip}")
            elif f == 0:
                print(f"PASS {case['id']}[{variant['name']}] ({p} steps)")
    print(f"\n{tot_pass} steps passed, {tot_fail} failed, {tot_skip} case-variants skipped"
          + (f"; server logs in {log_dir}" if args.server_cmd else ""))
    sys.exit(1 if tot_fail or (tot_skip and args.fail_on_skip) else 0)


if __name__ == "__main__":
    main()
