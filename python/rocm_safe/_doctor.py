"""The doctor's table, from its JSON report (as the doctor example prints it)."""

from __future__ import annotations

from typing import Any, Dict, List


def _gib(b: Any) -> str:
    return "unknown" if b is None else f"{b / (1 << 30):.1f} GiB"


def _status(compat: Dict[str, Any]) -> str:
    status = compat.get("status", "?")
    why = compat.get("why")
    if status == "verified":
        return "verified"
    if status == "falls_back":
        return f"falls back to {compat.get('to')} ({why})"
    if status == "skipped":
        return f"skipped ({why})"
    if status == "fails":
        return f"FAILS: {why}"
    return str(status)


def _verdict(v: Any) -> str:
    return "PASS" if str(v).lower() == "pass" else "FAIL"


def render(r: Dict[str, Any], all_passed: bool, usable: bool) -> str:
    out: List[str] = []
    verdict = (r.get("verdict") or {}).get("line")
    if verdict:
        # The verdict first and last, as the doctor example prints it.
        out += [verdict, ""]
    feats = r.get("features") or []
    out.append(f"rocm-safe {r.get('crate_version')} doctor (features: {', '.join(feats) if feats else 'none, CPU only'})")
    p = r.get("platform") or {}
    out += ["", "Platform"]
    for key in ("os", "kernel", "cpu", "cores"):
        out.append(f"  {key:<12} {p.get(key) if p.get(key) is not None else 'unknown'}")
    out.append(f"  {'memory':<12} {_gib(p.get('memory_total_bytes'))} total, {_gib(p.get('memory_available_bytes'))} available")
    for label, key in (("HIP runtime", "hip_runtime"), ("CUDA driver", "cuda_driver"), ("NVRTC", "nvrtc")):
        lib = p.get(key)
        out.append(f"  {label:<12} {'found (' + str(lib.get('soname')) + ')' if lib else 'not found'}")
    advice = r.get("advice") or []
    if advice:
        out += ["", "Advice"]
        for a in advice:
            mark = "ok    " if a.get("ok") else "CHANGE"
            out.append(f"  {mark} [{a.get('arch')}] {a.get('variable')} = {a.get('current') or '(unset)'}: {a.get('recommendation')}")
    out += ["", "Self-tests"]
    for t in r.get("self_tests") or []:
        out.append(f"  {_verdict(t.get('verdict'))}  {t.get('name', ''):<28} {t.get('millis', 0.0):>8.1f} ms  {t.get('detail', '')}")
    out += ["", "Backends and devices"]
    for b in r.get("backends") or []:
        devices = b.get("devices") or []
        if b.get("error"):
            out.append(f"  {b.get('backend', ''):<5} {b['error']}")
        elif not devices:
            out.append(f"  {b.get('backend', ''):<5} no devices")
        for d in devices:
            out.append(
                f"  {b.get('backend', ''):<5} #{d.get('ordinal')} {d.get('name')} ({d.get('arch')}, "
                f"{_gib(d.get('total_memory_bytes'))}, {d.get('multiprocessors')} CUs)"
            )
    out += ["", "Compatibility (operation x device, each checked against the CPU)"]
    for m in r.get("matrix") or []:
        op = f"{m.get('operation')} {m['tier']}" if m.get("tier") else str(m.get("operation"))
        out.append(f"  {op:<24} {m.get('device', ''):<8} {_status(m.get('compat') or m)}")
    out.append("")
    if all_passed and usable:
        out.append("All self-tests passed.")
    elif usable:
        out.append("A device self-test failed: its verified conversions fall back to the CPU (see above).")
    else:
        out.append("FAILED with no fallback left: do not trust this machine's results.")
    if verdict:
        out += ["", verdict]
    return "\n".join(out)
