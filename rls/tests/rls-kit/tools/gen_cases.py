#!/usr/bin/env python3
"""Generate /work/rls-kit/cases/*.yaml from envoyproxy/ratelimit facts.

Config file contents are read verbatim from the upstream snapshot (git bare dir)
so they are byte-exact; the steps/expectations are transcribed by hand below,
each with a citation. Re-run:  .venv/bin/python tools/gen_cases.py [GIT_DIR]

Nothing here is upstream code; it only reads upstream files as data.
"""
import os
import subprocess
import sys

import yaml

GIT_DIR = sys.argv[1] if len(sys.argv) > 1 else "/work/.mirror/envoyproxy+ratelimit/repo"
COMMIT = subprocess.check_output(["git", "--git-dir", GIT_DIR, "rev-parse", "HEAD"], text=True).strip()
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "cases")

DIV = {"SECOND": 1, "MINUTE": 60, "HOUR": 3600, "DAY": 86400, "WEEK": 604800,
       "MONTH": 2592000, "YEAR": 31536000}
T0 = 1700000000  # pinned clock for deterministic replays (2023-11-14T22:13:20Z)
IT = "test/integration/integration_test.go"
RUNTIME_LAYOUT = {"RUNTIME_SUBDIRECTORY": "ratelimit", "RUNTIME_APPDIRECTORY": "config"}


def show(path):
    return subprocess.check_output(["git", "--git-dir", GIT_DIR, "show", f"HEAD:{path}"], text=True)


README = show("README.md").split("\n")


def readme_yaml(first_line):
    """Return the ```yaml block whose fence opens at README line `first_line` (1-based)."""
    assert README[first_line - 1].strip() == "```yaml", (first_line, README[first_line - 1])
    out = []
    i = first_line
    while README[i].strip() != "```":
        out.append(README[i])
        i += 1
    return "\n".join(out) + "\n", f"README.md:{first_line + 1}-{i}"


def it_file(name):
    p = f"test/integration/runtime/current/ratelimit/config/{name}"
    return {"path": f"ratelimit/config/{name}", "source": p, "content": show(p)}


IT_FILES = [it_file("another.yaml"), it_file("basic.yaml"), it_file("share_threshold.yaml")]


def dur(unit, now):
    """Expected duration_until_reset: exact when the clock is pinned, else 1..divider."""
    d = DIV[unit]
    if now is None:
        return {"range": [1, d]}
    return {"seconds": d - now % d}


def st(code, rpu=None, unit=None, remaining=0, now=None, name=None, dur_set=None):
    """One expected DescriptorStatus."""
    s = {"code": code}
    if rpu is None:
        s["current_limit"] = None
        s["limit_remaining"] = remaining
        s["duration_until_reset"] = None
        return s
    cl = {"requests_per_unit": rpu, "unit": unit}
    if name:
        cl["name"] = name
    s["current_limit"] = cl
    s["limit_remaining"] = remaining
    s["duration_until_reset"] = dur(unit, now) if dur_set is None else dur_set
    return s


def nolimit(remaining=0):
    return st("OK", remaining=remaining)


def unlimited():
    return st("OK", remaining=4294967295)


def req(domain, descs, hits=None):
    r = {"domain": domain, "descriptors": []}
    for d in descs:
        if isinstance(d, dict):
            r["descriptors"].append(d)
        else:
            r["descriptors"].append({"entries": [list(e) for e in d]})
    if hits is not None:
        r["hits_addend"] = hits
    return r


def step(name, request, overall, statuses, now=None, provenance="asserted", cite=None, **kw):
    s = {"name": name}
    if now is not None:
        s["now_unix"] = now
    s["request"] = request
    s["expect"] = {"overall_code": overall, "statuses": statuses}
    s["provenance"] = provenance
    if cite:
        s["cite"] = cite
    s.update(kw)
    return s


def case(cid, title, kind, sources, files, steps, clock="optional", env=None, variants=None,
         vars_=None, notes=None, stats=None, layout=RUNTIME_LAYOUT):
    c = {
        "id": cid,
        "title": title,
        "kind": kind,
        "upstream": {"repo": "envoyproxy/ratelimit", "commit": COMMIT},
        "sources": sources,
        "clock": clock,
        "runtime": {"env": dict(layout), "files": files},
        "env": env or {},
    }
    if variants:
        c["variants"] = variants
    if vars_:
        c["vars"] = vars_
    if notes:
        c["notes"] = notes
    c["steps"] = steps
    if stats:
        c["stats_asserted_upstream"] = stats
    return c


# --------------------------------------------------------------------------------------
CASES = []

LOCAL_VARIANTS_NOTE = (
    "Upstream runs testBasicBaseConfig under many settings (TestBasicConfig, "
    f"{IT}:92-109; memcache/auth/TLS/cluster/sentinel variants 166-269). Response "
    "expectations are identical in every variant; with LOCAL_CACHE_SIZE_IN_BYTES>0 "
    "upstream uses the *_local keys (getCacheKey, 541-547), reproduced via ${L}.")

BASIC_VARIANTS = [
    {"name": "default", "env": {}, "vars": {"L": ""},
     "cite": f"{IT}:97 WithoutPerSecondRedis"},
    {"name": "local_cache", "env": {"LOCAL_CACHE_SIZE_IN_BYTES": "1000"}, "vars": {"L": "_local"},
     "cite": f"{IT}:99 WithoutPerSecondRedisWithLocalCache"},
    {"name": "cache_key_prefix", "env": {"CACHE_KEY_PREFIX": "prefix:"}, "vars": {"L": ""},
     "cite": f"{IT}:101-103 WithoutPerSecondRedisWithCachePrefix"},
    {"name": "without_watch_root", "env": {"RUNTIME_WATCH_ROOT": "false"}, "vars": {"L": ""},
     "cite": f"{IT}:206,458-463 BasicWithoutWatchRoot"},
]
STOP_VARIANTS = [
    {"name": "stop_increment", "env": {"STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT": "true"},
     "vars": {"L": ""}, "cite": f"{IT}:104 WithoutPerSecondRedisWithstopCacheKeyIncrementWhenOverlimitConfig"},
    {"name": "stop_increment_local_cache",
     "env": {"STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT": "true", "LOCAL_CACHE_SIZE_IN_BYTES": "1000"},
     "vars": {"L": "_local"},
     "cite": f"{IT}:106 WithoutPerSecondRedisWithLocalCacheAndstopCacheKeyIncrementWhenOverlimitConfig"},
]

# it01 unknown domain ------------------------------------------------------------------
CASES.append(case(
    "it01_unknown_domain", "Unknown domain: OK, no current_limit, limit_remaining 0, no duration",
    "upstream_integration_test",
    [{"file": IT, "lines": "561-571", "test": "testBasicBaseConfig (TestBasicConfig et al.)"}],
    IT_FILES,
    [step("foo hello=world", req("foo", [[("hello${L}", "world")]], 1), "OK", [nolimit()], now=T0,
          cite=f"{IT}:561-571")],
    variants=BASIC_VARIANTS + STOP_VARIANTS, notes=[LOCAL_VARIANTS_NOTE]))

# it02 basic key1 ----------------------------------------------------------------------
CASES.append(case(
    "it02_basic_key1_second", "basic/key1=foo: 50 per SECOND, remaining 49",
    "upstream_integration_test",
    [{"file": IT, "lines": "581-595", "test": "testBasicBaseConfig"}],
    IT_FILES,
    [step("basic key1=foo", req("basic", [[("key1${L}", "foo")]], 1), "OK",
          [st("OK", 50, "SECOND", 49, now=T0)], now=T0, cite=f"{IT}:581-595")],
    variants=BASIC_VARIANTS + STOP_VARIANTS, notes=[LOCAL_VARIANTS_NOTE],
    stats=[{"after_step": 1, "counter": "ratelimit.service.rate_limit.basic.key1${L}.total_hits", "value": 1,
            "cite": f"{IT}:597-599"}]))

# it03 key2 25 requests -----------------------------------------------------------------
steps = []
for i in range(25):
    over = i >= 20
    steps.append(step(
        f"key2 request #{i + 1}", req("another", [[("key2${L}", "${R}")]], 1),
        "OVER_LIMIT" if over else "OK",
        [st("OVER_LIMIT" if over else "OK", 20, "MINUTE", 0 if over else 20 - (i + 1), now=T0)],
        now=T0, cite=f"{IT}:613-639 (i={i})"))
CASES.append(case(
    "it03_another_key2_minute_over_limit",
    "another/key2=<random>: 20 per MINUTE; requests 1-20 OK (remaining 19..0), 21-25 OVER_LIMIT",
    "upstream_integration_test",
    [{"file": IT, "lines": "613-674", "test": "testBasicBaseConfig"}],
    IT_FILES, steps, variants=BASIC_VARIANTS + STOP_VARIANTS, vars_={"R": "random"},
    notes=[LOCAL_VARIANTS_NOTE,
           "Upstream uses real time and a random value (r.Int()); here the clock is pinned to T0 so "
           "all 25 requests are in one minute window (upstream can flake across a minute boundary).",
           "With STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT=true the single over-limit key is still "
           "incremented (see FINDINGS.md (a)); responses are identical."],
    stats=[{"after_step": n, "counter": "ratelimit.service.rate_limit.another.key2${L}.total_hits", "value": n,
            "cite": f"{IT}:640-641"} for n in (1, 20, 25)] +
          [{"after_step": n, "counter": "ratelimit.service.rate_limit.another.key2${L}.over_limit",
            "value": max(0, n - 20), "cite": f"{IT}:642-647"} for n in (20, 21, 25)]))


# it04/it05 two keys --------------------------------------------------------------------
def two_key_steps(stop):
    out = []
    for i in range(15):
        over = i >= 10
        rem1 = 20 - (i + 1)
        rem2 = 10 - (i + 1)
        if over:
            rem2 = 0
            if stop:
                rem1 = 10
        out.append(step(
            f"key2+key3 request #{i + 1}",
            req("another", [[("key2${L}", "${R}")], [("key3${L}", "${R}")]], 1),
            "OVER_LIMIT" if over else "OK",
            [st("OK", 20, "MINUTE", rem1, now=T0),
             st("OVER_LIMIT" if over else "OK", 10, "HOUR", rem2, now=T0)],
            now=T0, cite=f"{IT}:676-711 (i={i})"))
    return out


CASES.append(case(
    "it04_another_key2_key3_multi_descriptor",
    "Two descriptors in one request (key2 20/MINUTE, key3 10/HOUR): key3 goes over at #11; "
    "key2 keeps being incremented (default)",
    "upstream_integration_test",
    [{"file": IT, "lines": "676-766", "test": "testBasicBaseConfig"}],
    IT_FILES, two_key_steps(False), variants=BASIC_VARIANTS, vars_={"R": "random"},
    notes=[LOCAL_VARIANTS_NOTE,
           "Upstream uses a fresh random value for this loop (line 677); counters start at 0.",
           "Default behaviour: the non-exceeding key2 is incremented even when key3 is OVER_LIMIT "
           "(limitRemaining1 = 20-(i+1) for all i, line 689)."]))

CASES.append(case(
    "it05_another_key2_key3_stop_increment",
    "Same as it04 with STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT=true: once key3 would exceed, "
    "key2 is frozen at 10 (remaining stays 10)",
    "upstream_integration_test",
    [{"file": IT, "lines": "676-711", "test": "testBasicBaseConfig, stopCacheKeyIncrementWhenOverlimit variants (104-107)"},
     {"file": "src/redis/fixed_cache_impl.go", "lines": "44-72,115-187"}],
    IT_FILES, two_key_steps(True), variants=STOP_VARIANTS, vars_={"R": "random"},
    notes=["Line 694-698: 'if s.StopCacheKeyIncrementWhenOverlimit && s.BackendType != \"memcache\" "
           "{ limitRemaining1 = 10 }' for i >= 10."]))

# it06 duration until reset -------------------------------------------------------------
CASES.append(case(
    "it06_duration_until_reset_ticks",
    "another/key4=durTest (20 per DAY): duration_until_reset decreases after 2 s",
    "upstream_integration_test",
    [{"file": IT, "lines": "768-779", "test": "testBasicBaseConfig"}],
    IT_FILES,
    [step("first", req("another", [[("key4${L}", "durTest")]], 1), "OK",
          [st("OK", 20, "DAY", 19, now=T0)], now=T0, provenance="derived",
          cite=f"{IT}:769-771; upstream only compares the two durations"),
     step("after 2 s", req("another", [[("key4${L}", "durTest")]], 1), "OK",
          [st("OK", 20, "DAY", 18, now=T0 + 2)], now=T0 + 2, provenance="derived",
          cite=f"{IT}:773-779 (time.Sleep(2s); resp2 duration < resp1 duration)")],
    clock="required", variants=BASIC_VARIANTS + STOP_VARIANTS,
    notes=["Upstream asserts only resp2.duration < resp1.duration (line 779) after a real 2 s sleep. "
           "Here the sleep is expressed as now_unix T0 -> T0+2, so exact values follow from "
           "utils.CalculateReset (src/utils/utilities.go:41-45): 86400 - now % 86400.",
           "limit_remaining 19/18 is derived (another.yaml key4: 20/day), not asserted upstream; "
           "upstream's value 'durTest' is fixed, so on a re-used Redis the counts differ."]))

# it07 reload ---------------------------------------------------------------------------
RELOAD = {"path": "ratelimit/config/reload.yaml", "source": "test/integration/runtime/current/ratelimit/reload.yaml",
          "content": show("test/integration/runtime/current/ratelimit/reload.yaml")}
CASES.append(case(
    "it07_config_reload_without_watch_root",
    "Adding reload.yaml to the config dir is picked up (RUNTIME_WATCH_ROOT=false); removing it reloads again",
    "upstream_integration_test",
    [{"file": IT, "lines": "202-209,507-511,806-891", "test": "TestBasicReloadConfig/ReloadWithoutWatchRoot"}],
    IT_FILES,
    [step("before reload: domain 'reload' unknown", req("reload", [[("block${L}", "foo")]], 1), "OK",
          [nolimit()], now=T0, cite=f"{IT}:818-828"),
     {"name": "copy reload.yaml into config dir", "action": "write_config", "file": RELOAD,
      "cite": f"{IT}:833,864-884"},
     step("after reload: key1 50/SECOND", req("reload", [[("key1${L}", "foo")]], 1), "OK",
          [st("OK", 50, "SECOND", 49, now=T0)], now=T0, eventually={"timeout_s": 120, "interval_s": 1},
          cite=f"{IT}:834-853 (upstream waits up to 120 s for config_load_success to increase)"),
     {"name": "remove reload.yaml", "action": "remove_config", "path": RELOAD["path"],
      "cite": f"{IT}:855-860,886-891"},
     step("after removal: domain 'reload' gone again", req("reload", [[("block${L}", "foo")]], 1), "OK",
          [nolimit()], now=T0, provenance="derived", eventually={"timeout_s": 120, "interval_s": 1},
          cite=f"{IT}:855-860 asserts only that config_load_success increased; "
               "the unknown-domain answer follows from config_impl.go:451-457")],
    env={"RUNTIME_WATCH_ROOT": "false"},
    variants=[{"name": "default", "env": {}, "vars": {"L": ""}, "cite": f"{IT}:207"}],
    notes=["reload.yaml is not in the config dir at start; the runner copies it in at step 2 "
           "(needs --runtime-root or --server-cmd).",
           "Polling with 'eventually' is safe: before the reload the domain is unknown and no counter "
           "is touched (GetLimit returns nil, config_impl.go:451-457; cache_key.go:51-56).",
           "Upstream also asserts the stat ratelimit.service.config_load_success increases after each "
           "change (waitForConfigReload, 893-912)."]))

# it08 share_threshold -------------------------------------------------------------------
steps = []
for i in range(10):
    steps.append(step(f"files/a.pdf #{i + 1}", req("share-threshold-test", [[("files", "files/a.pdf")]], 1),
                      "OK", [st("OK", 10, "HOUR", 9 - i, now=T0)], now=T0, provenance="derived",
                      cite=f"{IT}:939-947 (upstream accepts OK or OVER_LIMIT here)"))
steps.append(step("files/b.csv shares the files/* counter", req("share-threshold-test", [[("files", "files/b.csv")]], 1),
                  "OVER_LIMIT", [st("OVER_LIMIT", 10, "HOUR", 0, now=T0)], now=T0, cite=f"{IT}:949-963"))
for i in range(10):
    steps.append(step(f"files_no_share/<unique {i + 1}>",
                      req("share-threshold-test", [[("files_no_share", "files_no_share/${R}-" + str(i))]], 1),
                      "OK", [st("OK", 10, "HOUR", 9, now=T0)], now=T0, cite=f"{IT}:965-989"))
CASES.append(case(
    "it08_share_threshold", "share_threshold: files/* values share one counter; files_no_share/* values are isolated",
    "upstream_integration_test",
    [{"file": IT, "lines": "914-991", "test": "TestShareThreshold/WithoutPerSecondRedis"}],
    IT_FILES, steps, vars_={"R": "random"},
    notes=["Upstream's first 10 requests accept OK or OVER_LIMIT because the Redis key "
           "'share-threshold-test_files_files/*_<hour>' may survive from an earlier run in the same "
           "hour. On a fresh server they are OK with remaining 9..0 (marked derived).",
           "Upstream builds unique files_no_share values from timestamp+random (972); here ${R}-<i>."]))

# ----------------------------------------------------------------------- README examples
def rd_case(cid, title, yaml_lines, steps, notes=None, clock="optional", env=None, extra_sources=None,
            fname=None):
    files, srcs = [], []
    for n, line in enumerate(yaml_lines):
        content, src = readme_yaml(line)
        dom = yaml.safe_load(content)["domain"]
        files.append({"path": f"ratelimit/config/{fname or dom}{'' if len(yaml_lines) == 1 else '_' + str(n + 1)}.yaml",
                      "source": src, "content": content})
        srcs.append({"file": "README.md", "lines": src.split(":")[1], "test": "README Examples"})
    return case(cid, title, "readme_example", srcs + (extra_sources or []), files, steps, clock=clock,
                env=env, notes=(notes or []) + [
                    "README examples carry no upstream test; expected responses are derived from source: "
                    "matching src/config/config_impl.go:446-673, counting src/redis/fixed_cache_impl.go + "
                    "src/limiter/base_limiter.go:83-143, assembly src/service/ratelimit.go:186-279."])


D = "derived"
CASES.append(rd_case(
    "rd01_mongo_cps", "Example 1: two key=value limits, 500/SECOND each; other values unlimited-by-absence",
    [376],
    [step("database=users", req("mongo_cps", [[("database", "users")]]), "OK", [st("OK", 500, "SECOND", 499, now=T0)], now=T0, provenance=D),
     step("database=default", req("mongo_cps", [[("database", "default")]]), "OK", [st("OK", 500, "SECOND", 499, now=T0)], now=T0, provenance=D),
     step("database=users again", req("mongo_cps", [[("database", "users")]]), "OK", [st("OK", 500, "SECOND", 498, now=T0)], now=T0, provenance=D),
     step("database=other: no match", req("mongo_cps", [[("database", "other")]]), "OK", [nolimit()], now=T0, provenance=D,
          cite="config_impl.go:495-520 (no key-only entry 'database')")],
    notes=["hits_addend omitted (0) => 1 (src/utils/utilities.go:84-86)."]))

msg_both = lambda n: req("messaging", [[("message_type", "marketing"), ("to_number", n)], [("to_number", n)]])
steps = []
for i in range(6):
    over = i >= 5
    steps.append(step(f"README request #{i + 1} (marketing + to_number 2061111111)", msg_both("2061111111"),
                      "OVER_LIMIT" if over else "OK",
                      [st("OVER_LIMIT" if over else "OK", 5, "DAY", 0 if over else 4 - i, now=T0),
                       st("OK", 100, "DAY", 99 - i, now=T0)], now=T0, provenance=D,
                      cite="README.md:433-445 (request), 404-417 (limits)"))
steps += [
    step("other number has its own counters", msg_both("2062222222"), "OK",
         [st("OK", 5, "DAY", 4, now=T0), st("OK", 100, "DAY", 99, now=T0)], now=T0, provenance=D,
         cite="README.md:425-431"),
    step("placeholder level alone: no limit", req("messaging", [[("message_type", "marketing")]]), "OK", [nolimit()],
         now=T0, provenance=D, cite="config_impl.go:574-608 (limit only at last entry; placeholder has none)"),
    step("other message_type: no nested match", req("messaging", [[("message_type", "transactional"), ("to_number", "2061111111")]]),
         "OK", [nolimit()], now=T0, provenance=D, cite="config_impl.go:495-520"),
]
CASES.append(rd_case("rd02_messaging_nested", "Example 2: nested placeholder + key-only limits; multi-descriptor request", [401], steps,
                     notes=["Counters are per request value (cache_key.go:66-82), so each to_number has its own.",
                            "Request #6: first descriptor OVER_LIMIT, second still incremented (99-5=94): overall OVER_LIMIT."]))

CASES.append(rd_case(
    "rd03_edge_proxy_per_ip", "Example 3: key=value beats key-only; requests_per_unit 0 always OVER_LIMIT", [451],
    [step("50.0.0.1 -> generic 10/s", req("edge_proxy_per_ip", [[("remote_address", "50.0.0.1")]]), "OK",
          [st("OK", 10, "SECOND", 9, now=T0)], now=T0, provenance=D),
     step("50.0.0.5 -> blacklist 0/s", req("edge_proxy_per_ip", [[("remote_address", "50.0.0.5")]]), "OVER_LIMIT",
          [st("OVER_LIMIT", 0, "SECOND", 0, now=T0)], now=T0, provenance=D,
          cite="config_impl.go:495-501 exact key_value first; base_limiter.go:104-107 (1 > 0)")],
    notes=["In /json (protojson) the OVER_LIMIT status's currentLimit is {\"unit\":\"SECOND\"}: requestsPerUnit 0 is omitted."]))

CASES.append(rd_case(
    "rd04a_example4_depth_mismatch", "Example 4 (first config): 2-entry request does NOT match a 1-level limit", [492],
    [step("(key,value),(subkey,subvalue): no limit", req("example4", [[("key", "value"), ("subkey", "subvalue")]]), "OK",
          [nolimit()], now=T0, provenance=D, cite="README.md:478-490; config_impl.go:577-607"),
     step("(key,value) alone: 300/s", req("example4", [[("key", "value")]]), "OK",
          [st("OK", 300, "SECOND", 299, now=T0)], now=T0, provenance=D)], fname="example4"))

CASES.append(rd_case(
    "rd04b_example4_nested", "Example 4 (second config): nested key-only subkey matches the 2-entry request", [504],
    [step("(key,value),(subkey,subvalue): 300/s", req("example4", [[("key", "value"), ("subkey", "subvalue")]]), "OK",
          [st("OK", 300, "SECOND", 299, now=T0)], now=T0, provenance=D, cite="README.md:502-514"),
     step("(key,value) alone: placeholder, no limit", req("example4", [[("key", "value")]]), "OK",
          [nolimit()], now=T0, provenance=D)], fname="example4"))

CASES.append(rd_case(
    "rd05_unlimited", "Example 5: unlimited => OK, no current_limit, limit_remaining MaxUint32, no duration", [520],
    [step("ldap unlimited", req("internal", [[("ldap", "x")]]), "OK", [unlimited()], now=T0, provenance=D,
          cite="README.md:536; src/service/ratelimit.go:162-165,224-228; test/service/ratelimit_test.go:527-565 TestUnlimited"),
     step("azure 100/min", req("internal", [[("azure", "x")]]), "OK", [st("OK", 100, "MINUTE", 99, now=T0)], now=T0, provenance=D),
     step("both in one request", req("internal", [[("ldap", "y")], [("azure", "x")]]), "OK",
          [unlimited(), st("OK", 100, "MINUTE", 98, now=T0)], now=T0, provenance=D)]))

steps = []
for i in range(11):
    over = i >= 10
    steps.append(step(f"user-a #{i + 1} (shadow)", req("example6", [[("service", "auth-service"), ("user", "user-a")]]), "OK",
                      [st("OK", 10, "SECOND", 0 if over else 9 - i, now=T0)], now=T0, provenance=D,
                      cite="base_limiter.go:104-107,134-140 (over -> code forced OK, remaining 0, limit+duration kept)"))
for i in range(21):
    over = i >= 20
    steps.append(step(f"user-b #{i + 1}", req("example6", [[("service", "auth-service"), ("user", "user-b")]]),
                      "OVER_LIMIT" if over else "OK",
                      [st("OVER_LIMIT" if over else "OK", 20, "SECOND", 0 if over else 19 - i, now=T0)], now=T0, provenance=D))
steps.append(step("next second: user-a window reset", req("example6", [[("service", "auth-service"), ("user", "user-a")]]), "OK",
                  [st("OK", 10, "SECOND", 9, now=T0 + 1)], now=T0 + 1, provenance=D, cite="cache_key.go:81-82 new window key"))
CASES.append(rd_case("rd06_shadow_mode_rule", "Example 6: rule shadow_mode never limits; user-b limited at 20/s", [552], steps,
                     clock="required",
                     notes=["Needs a pinned clock: 32 requests must land in one SECOND window."]))

A = [("key_1", "value_1"), ("user", "bkthomps")]
B = [("key_2", "value_2"), ("user", "bkthomps")]
CASES.append(rd_case(
    "rd07_replaces", "Example 7: a matched limit named in another matched limit's replaces is dropped (not counted)", [583],
    [step("A alone: specific_limit 5/s", req("example7", [A]), "OK", [st("OK", 5, "SECOND", 4, now=T0, name="specific_limit")],
          now=T0, provenance=D, cite="config_impl.go:99-118 (name copied into current_limit)"),
     step("B alone: 10/s", req("example7", [B]), "OK", [st("OK", 10, "SECOND", 9, now=T0)], now=T0, provenance=D),
     step("A and B together: A replaced", req("example7", [A, B]), "OK",
          [nolimit(), st("OK", 10, "SECOND", 8, now=T0)], now=T0, provenance=D,
          cite="src/service/ratelimit.go:157-180 (replaced -> nil limit -> OK, no current_limit)"),
     step("A alone again: its counter was not touched", req("example7", [A]), "OK",
          [st("OK", 5, "SECOND", 3, now=T0, name="specific_limit")], now=T0, provenance=D,
          cite="README.md:325 'the limit of the original will not be changed'")],
    clock="required", notes=["README.md:578-580 writes the combined request as '(key_1, value_1), (key_2, value_2), "
                             "(user, bkthomps)'; it is two descriptors [A, B] in one request.",
                             "Needs a pinned clock (SECOND windows across 4 requests)."]))

CASES.append(rd_case(
    "rd08_detailed_metric", "Example 8: detailed_metric changes only stats keys; limits as configured (per MINUTE)", [619],
    [step("key1=unspecified_value -> 10/min", req("example8", [[("key1", "unspecified_value")]]), "OK",
          [st("OK", 10, "MINUTE", 9, now=T0)], now=T0, provenance=D),
     step("key1=unspecified_value2 -> own counter", req("example8", [[("key1", "unspecified_value2")]]), "OK",
          [st("OK", 10, "MINUTE", 9, now=T0)], now=T0, provenance=D),
     step("key1=value1 -> 20/min", req("example8", [[("key1", "value1")]]), "OK",
          [st("OK", 20, "MINUTE", 19, now=T0)], now=T0, provenance=D)],
    notes=["README prose (README.md:614-616) says '10 / sec' and '20 / sec' but the YAML says unit: minute; "
           "the YAML is what loads, so MINUTE is expected.",
           "Stats keys (not checked by the client): ratelimit.service.rate_limit.example8.key1_unspecified_value.*, "
           "...key1_unspecified_value2.*, ...key1_value1.* (README.md:634-642; config_impl.go:626-657)."]))

CASES.append(rd_case(
    "rd09a_wildcard_trailing", "Example 9: trailing wildcard value*", [650],
    [step("value1", req("example9", [[("key1", "value1")]]), "OK", [st("OK", 20, "MINUTE", 19, now=T0)], now=T0, provenance=D),
     step("valueXYZ (own counter)", req("example9", [[("key1", "valueXYZ")]]), "OK", [st("OK", 20, "MINUTE", 19, now=T0)], now=T0, provenance=D),
     step("'value' (* matches zero chars)", req("example9", [[("key1", "value")]]), "OK", [st("OK", 20, "MINUTE", 19, now=T0)], now=T0, provenance=D,
          cite="config_impl.go:199-238 wildcardMatch"),
     step("xvalue1: no match", req("example9", [[("key1", "xvalue1")]]), "OK", [nolimit()], now=T0, provenance=D)],
    fname="example9"))
CASES.append(rd_case(
    "rd09b_wildcard_middle", "Example 9: middle wildcard /api/*/action", [664],
    [step("/api/123/action", req("example9", [[("path", "/api/123/action")]]), "OK", [st("OK", 20, "MINUTE", 19, now=T0)], now=T0, provenance=D),
     step("/api/user-id/action", req("example9", [[("path", "/api/user-id/action")]]), "OK", [st("OK", 20, "MINUTE", 19, now=T0)], now=T0, provenance=D),
     step("/api/123/other: no match", req("example9", [[("path", "/api/123/other")]]), "OK", [nolimit()], now=T0, provenance=D)],
    fname="example9", notes=["Middle '*' is HEAD behaviour (README.md:646); older releases matched trailing '*' only."]))
CASES.append(rd_case(
    "rd09c_wildcard_multiple", "Example 9: multiple wildcards /api/*/resource/*/action", [678],
    [step("/api/v1/resource/123/action", req("example9", [[("route", "/api/v1/resource/123/action")]]), "OK",
          [st("OK", 20, "MINUTE", 19, now=T0)], now=T0, provenance=D),
     step("/api/v2/resource/456/action", req("example9", [[("route", "/api/v2/resource/456/action")]]), "OK",
          [st("OK", 20, "MINUTE", 19, now=T0)], now=T0, provenance=D),
     step("/api/v1/other/123/action: no match", req("example9", [[("route", "/api/v1/other/123/action")]]), "OK",
          [nolimit()], now=T0, provenance=D)],
    fname="example9"))

CASES.append(rd_case(
    "rd10_value_to_metric", "Example 10: value_to_metric changes only stats keys", [694, 721],
    [step("route=api GET 123", req("example10", [[("route", "api"), ("http_method", "GET"), ("subject_id", "123")]]), "OK",
          [st("OK", 60, "MINUTE", 59, now=T0)], now=T0, provenance=D),
     step("route=web POST 456", req("example10", [[("route", "web"), ("http_method", "POST"), ("subject_id", "456")]]), "OK",
          [st("OK", 60, "MINUTE", 59, now=T0)], now=T0, provenance=D),
     step("route=api GET 123 again", req("example10", [[("route", "api"), ("http_method", "GET"), ("subject_id", "123")]]), "OK",
          [st("OK", 60, "MINUTE", 58, now=T0)], now=T0, provenance=D),
     step("wildcard: alice readfile documents", req("example10_wildcard", [[("user", "alice"), ("action", "readfile"), ("resource", "documents")]]), "OK",
          [st("OK", 100, "MINUTE", 99, now=T0)], now=T0, provenance=D),
     step("wildcard: action=write no match", req("example10_wildcard", [[("user", "alice"), ("action", "write"), ("resource", "documents")]]), "OK",
          [nolimit()], now=T0, provenance=D)],
    notes=["Stats keys (not checked): example10.route_api.http_method_GET.subject_id, "
           "example10_wildcard.user_alice.action_readfile.resource (README.md:711-738)."]))

steps = []
for i in range(5):
    steps.append(step(f"files/a.pdf #{i + 1}", req("example11", [[("files", "files/a.pdf")]]), "OK",
                      [st("OK", 10, "HOUR", 9 - i, now=T0)], now=T0, provenance=D))
for i in range(5):
    steps.append(step(f"files/b.csv #{i + 1}", req("example11", [[("files", "files/b.csv")]]), "OK",
                      [st("OK", 10, "HOUR", 4 - i, now=T0)], now=T0, provenance=D))
steps.append(step("files/c.txt -> OVER_LIMIT (shared counter)", req("example11", [[("files", "files/c.txt")]]), "OVER_LIMIT",
                  [st("OVER_LIMIT", 10, "HOUR", 0, now=T0)], now=T0, provenance=D, cite="README.md:769"))
for i in range(10):
    steps.append(step(f"files_no_share/a.pdf #{i + 1}", req("example11", [[("files_no_share", "files_no_share/a.pdf")]]), "OK",
                      [st("OK", 10, "HOUR", 9 - i, now=T0)], now=T0, provenance=D))
steps.append(step("files_no_share/b.csv still allowed", req("example11", [[("files_no_share", "files_no_share/b.csv")]]), "OK",
                  [st("OK", 10, "HOUR", 9, now=T0)], now=T0, provenance=D, cite="README.md:771"))
steps += [
    step("example11_metrics api/v1 GET", req("example11_metrics", [[("route", "api/v1"), ("method", "GET")]]), "OK",
         [st("OK", 60, "MINUTE", 59, now=T0)], now=T0, provenance=D),
    step("example11_metrics api/v2 GET shares (route pattern api/* in key)", req("example11_metrics", [[("route", "api/v2"), ("method", "GET")]]), "OK",
         [st("OK", 60, "MINUTE", 58, now=T0)], now=T0, provenance=D,
         cite="config_impl.go:522-532,597-604; cache_key.go:69-76 (pattern applies at entry index 0 although the limit is at index 1)"),
    step("example11_metrics api/v1 POST: different method, own counter", req("example11_metrics", [[("route", "api/v1"), ("method", "POST")]]), "OK",
         [st("OK", 60, "MINUTE", 59, now=T0)], now=T0, provenance=D),
]
CASES.append(rd_case("rd11_share_threshold", "Example 11: share_threshold true vs false", [746, 775], steps))

# --------------------------------------------------------------- source-derived extras
SRC_CFG = {"path": "ratelimit/config/kit.yaml", "source": "kit-authored (upstream keys only)",
           "content": "domain: kit\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: hour\n      requests_per_unit: 5\n"
                      "  - key: key4\n    value: value4\n    rate_limit:\n      unit: hour\n      requests_per_unit: 15\n"
                      "  - key: key5\n    value: value5\n    rate_limit:\n      unit: hour\n      requests_per_unit: 14\n"}
NOW_UT = 1000000


def phd(entries, h):
    return {"entries": [list(e) for e in entries], "hits_addend": h}


CASES.append(case(
    "src01_stop_increment_unit_test_replay",
    "TestOverLimitWithStopCacheKeyIncrementWhenOverlimitConfig replayed end-to-end (per-descriptor hits_addend)",
    "upstream_unit_test",
    [{"file": "test/redis/fixed_cache_impl_test.go", "lines": "639-761",
      "test": "TestOverLimitWithStopCacheKeyIncrementWhenOverlimitConfig"},
     {"file": "src/redis/fixed_cache_impl.go", "lines": "44-72,115-221"}],
    [SRC_CFG],
    [step("seed both keys to 10", req("kit", [phd([("key4", "value4")], 10), phd([("key5", "value5")], 10)], 1), "OK",
          [st("OK", 15, "HOUR", 5, now=NOW_UT), st("OK", 14, "HOUR", 4, now=NOW_UT)], now=NOW_UT, provenance=D,
          cite="brings the counters to the unit test's mocked GET values (10, 10)"),
     step("hits 1,1 (unit test block 1)", req("kit", [phd([("key4", "value4")], 1), phd([("key5", "value5")], 1)], 1), "OK",
          [st("OK", 15, "HOUR", 4, now=NOW_UT), st("OK", 14, "HOUR", 3, now=NOW_UT)], now=NOW_UT,
          cite="fixed_cache_impl_test.go:656-681"),
     step("hits 2,2 (unit test block 2)", req("kit", [phd([("key4", "value4")], 2), phd([("key5", "value5")], 2)], 1), "OK",
          [st("OK", 15, "HOUR", 2, now=NOW_UT), st("OK", 14, "HOUR", 1, now=NOW_UT)], now=NOW_UT,
          cite="fixed_cache_impl_test.go:697-715"),
     step("hits 2,2: key5 would exceed -> only key5 incremented", req("kit", [phd([("key4", "value4")], 2), phd([("key5", "value5")], 2)], 1),
          "OVER_LIMIT", [st("OK", 15, "HOUR", 2, now=NOW_UT), st("OVER_LIMIT", 14, "HOUR", 0, now=NOW_UT)], now=NOW_UT,
          cite="fixed_cache_impl_test.go:731-747 (INCRBY key4 0, INCRBY key5 2)"),
     step("key4 check-only (hits 0): still 13", req("kit", [phd([("key4", "value4")], 0)], 1), "OK",
          [st("OK", 15, "HOUR", 2, now=NOW_UT)], now=NOW_UT, provenance=D,
          cite="hits_addend 0 = check only (utilities.go:79-83): key4 stayed at 13")],
    env={"STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT": "true"}, clock="required",
    notes=["The unit test mocks Redis GET results; this case reaches the same counter states through real requests. "
           "now=1000000 => hour window 997200, duration 800 s (as CalculateReset in the test).",
           "Config file is kit-authored (upstream keys only) because the unit test passes limits directly."]))

CASES.append(case(
    "src02_counting_and_hits_addend",
    "Rejected hits are still counted; request vs per-descriptor hits_addend; 0 = check only",
    "source_derived",
    [{"file": "src/utils/utilities.go", "lines": "75-90"},
     {"file": "src/redis/fixed_cache_impl.go", "lines": "35-38,160-221"},
     {"file": "src/limiter/base_limiter.go", "lines": "83-143"}],
    [SRC_CFG],
    [step("k=a hits 3", req("kit", [[("k", "a")]], 3), "OK", [st("OK", 5, "HOUR", 2, now=T0)], now=T0, provenance=D),
     step("k=a hits 3 -> 6 > 5", req("kit", [[("k", "a")]], 3), "OVER_LIMIT", [st("OVER_LIMIT", 5, "HOUR", 0, now=T0)], now=T0, provenance=D),
     step("k=a per-descriptor hits 0 (check only) -> still over, count stays 6", req("kit", [phd([("k", "a")], 0)], 1),
          "OVER_LIMIT", [st("OVER_LIMIT", 5, "HOUR", 0, now=T0)], now=T0, provenance=D),
     step("k=b request hits_addend 0 => 1", req("kit", [[("k", "b")]], 0), "OK", [st("OK", 5, "HOUR", 4, now=T0)], now=T0, provenance=D),
     step("k=b per-descriptor 2 overrides request 3", req("kit", [phd([("k", "b")], 2)], 3), "OK", [st("OK", 5, "HOUR", 2, now=T0)], now=T0, provenance=D),
     step("k=b per-descriptor 0 = check only", req("kit", [phd([("k", "b")], 0)], 3), "OK", [st("OK", 5, "HOUR", 2, now=T0)], now=T0, provenance=D),
     step("two identical descriptors share one counter, each reports its own INCRBY reply",
          req("kit", [[("k", "c")], [("k", "c")]], 1), "OK",
          [st("OK", 5, "HOUR", 4, now=T0), st("OK", 5, "HOUR", 3, now=T0)], now=T0, provenance=D,
          cite="fixed_cache_impl.go:161-187,209-218: two INCRBY on one key in one pipeline; results[i] is "
               "each command's own reply (1 then 2)"),
     step("next hour window resets", req("kit", [[("k", "a")]], 1), "OK",
          [st("OK", 5, "HOUR", 4, now=T0 - T0 % 3600 + 3600)], now=T0 - T0 % 3600 + 3600, provenance=D,
          cite="cache_key.go:81-82 (window start = now/divider*divider)")],
    clock="required",
    notes=["Two identical descriptors in one request hit one counter twice; each status reports the reply of "
           "its own INCRBY (remaining 4 then 3), a Redis-pipeline artefact a memory backend must reproduce to "
           "be a drop-in."]))

CASES.append(case(
    "src03_override_errors_global_shadow",
    "Request limit override; override ignored for unknown domain; empty domain / empty descriptors errors",
    "source_derived",
    [{"file": "src/config/config_impl.go", "lines": "446-475"},
     {"file": "src/service/ratelimit.go", "lines": "186-191,400-444"},
     {"file": "src/server/server_impl.go", "lines": "84-144"},
     {"file": "test/config/config_test.go", "lines": "256-334", "test": "TestConfigLimitOverride"}],
    [SRC_CFG],
    [step("override in known domain, no config entry matches", req("kit", [{"entries": [["zz", "1"]], "limit": {"requests_per_unit": 2, "unit": "MINUTE"}}]), "OK",
          [st("OK", 2, "MINUTE", 1, now=T0)], now=T0, provenance=D),
     step("override again -> 2", req("kit", [{"entries": [["zz", "1"]], "limit": {"requests_per_unit": 2, "unit": "MINUTE"}}]), "OK",
          [st("OK", 2, "MINUTE", 0, now=T0)], now=T0, provenance=D),
     step("override -> 3 > 2", req("kit", [{"entries": [["zz", "1"]], "limit": {"requests_per_unit": 2, "unit": "MINUTE"}}]), "OVER_LIMIT",
          [st("OVER_LIMIT", 2, "MINUTE", 0, now=T0)], now=T0, provenance=D),
     step("override replaces configured k limit", req("kit", [{"entries": [["k", "o"]], "limit": {"requests_per_unit": 100, "unit": "DAY"}}]), "OK",
          [st("OK", 100, "DAY", 99, now=T0)], now=T0, provenance=D),
     step("override ignored in unknown domain", req("nope", [{"entries": [["zz", "1"]], "limit": {"requests_per_unit": 2, "unit": "MINUTE"}}]), "OK",
          [nolimit()], now=T0, provenance=D, cite="config_impl.go:451-457 (domain check precedes override)"),
     {"name": "empty domain -> error", "now_unix": T0, "request": req("", [[("k", "a")]]),
      "expect": {"error": {"grpc_code": "UNKNOWN", "message": "rate limit domain must not be empty", "http_status": 400}},
      "provenance": D, "cite": "ratelimit.go:189; server_impl.go:103-108 (/json -> 400 'Bad Request')"},
     {"name": "empty descriptors -> error", "now_unix": T0, "request": {"domain": "kit", "descriptors": []},
      "expect": {"error": {"grpc_code": "UNKNOWN", "message": "rate limit descriptor list must not be empty", "http_status": 400}},
      "provenance": D, "cite": "ratelimit.go:190; test/service/ratelimit_test.go:463-486"}],
    clock="optional",
    notes=["gRPC code UNKNOWN: the handler returns a plain Go error (serviceError), which grpc-go maps to codes.Unknown "
           "with the error text as message.",
           "/json: service errors give HTTP 400 with http.Error body 'Bad Request\\n' (text/plain), not JSON."]))

CASES.append(case(
    "src04_global_shadow_mode",
    "SHADOW_MODE=true: overall_code OVER_LIMIT becomes OK, statuses keep OVER_LIMIT",
    "source_derived",
    [{"file": "src/service/ratelimit.go", "lines": "250-270"},
     {"file": "test/service/ratelimit_test.go", "lines": "220-275", "test": "TestServiceGlobalShadowMode"}],
    [SRC_CFG],
    [step("k=s hits 6 > 5", req("kit", [[("k", "s")], [("unknown", "x")]], 6), "OK",
          [st("OVER_LIMIT", 5, "HOUR", 0, now=T0), nolimit()], now=T0, provenance=D)],
    env={"SHADOW_MODE": "true"}, clock="optional"))


# ------------------------------------------------------------------------------- output
class Dumper(yaml.SafeDumper):
    pass


class Flow(list):
    pass


Dumper.add_representer(Flow, lambda d, v: d.represent_sequence("tag:yaml.org,2002:seq", v, flow_style=True))


def flowify(o, parent_key=None):
    """entries: [[k, v], ...] and range: [a, b] are written in flow style."""
    if isinstance(o, dict):
        return {k: flowify(v, k) for k, v in o.items()}
    if isinstance(o, list):
        if parent_key in ("entries",):
            return [Flow(e) for e in o]
        if parent_key == "range":
            return Flow(o)
        return [flowify(v) for v in o]
    return o


def _str(dumper, data):
    if "\n" in data:
        return dumper.represent_scalar("tag:yaml.org,2002:str", data, style="|")
    return dumper.represent_scalar("tag:yaml.org,2002:str", data)


Dumper.add_representer(str, _str)


def main():
    os.makedirs(OUT, exist_ok=True)
    for c in CASES:
        path = os.path.join(OUT, c["id"] + ".yaml")
        with open(path, "w") as f:
            f.write(f"# Generated by tools/gen_cases.py from envoyproxy/ratelimit@{COMMIT[:12]}; see cases/README.md\n")
            yaml.dump(flowify(c), f, Dumper=Dumper, sort_keys=False, width=120, allow_unicode=True)
        # round-trip check: config contents must be byte-identical after YAML load
        back = yaml.safe_load(open(path))
        for a, b in zip(back["runtime"]["files"], c["runtime"]["files"]):
            assert a["content"] == b["content"], (path, a["path"])
        print("wrote", path, len(c["steps"]), "steps")


if __name__ == "__main__":
    main()
