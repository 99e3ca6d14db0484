//! The doctor's report as text: the one renderer behind the `doctor`
//! example and Python's `rocm_safe.doctor()`.
//!
//! The verdict comes first and last; between them every section of the
//! [`Report`]: platform, the libraries this process uses, the APU memory
//! figures, the HIP build, the environment, advice, self-tests, devices and
//! the compatibility matrix. [`Audience`] picks how commands are written
//! (cargo for a Rust checkout, pip for the Python package).

use super::{compiler_needed, Audience, Compat, Library, Report, SelfTest, Verdict};

/// Appends one line (formatted like `format!`) to the output.
macro_rules! w {
    ($o:expr) => {
        $o.push('\n')
    };
    ($o:expr, $($t:tt)*) => {{
        $o.push_str(&format!($($t)*));
        $o.push('\n');
    }};
}

/// The report as the doctor prints it, its commands written for the
/// report's audience ([`Report::for_audience`]).
pub fn render_text(report: &Report) -> String {
    let mut out = String::new();
    table(&mut out, report, report.audience);
    out
}

fn gib(bytes: Option<u64>) -> String {
    bytes.map_or_else(
        || "unknown".to_owned(),
        |b| format!("{:.1} GiB", b as f64 / (1u64 << 30) as f64),
    )
}

fn lib(l: &Option<Library>) -> String {
    match l {
        Some(l) => format!(
            "found ({}{}{})",
            l.soname,
            l.real_path
                .as_ref()
                .or(l.path.as_ref())
                .map(|p| format!(" -> {p}"))
                .unwrap_or_default(),
            l.file_version
                .as_ref()
                .map(|v| format!(", file version {v}"))
                .unwrap_or_default()
        ),
        None => "not found".to_owned(),
    }
}

fn verdict(t: &SelfTest) -> &'static str {
    match t.verdict {
        Verdict::Pass => "PASS",
        Verdict::Fail => "FAIL",
    }
}

fn table(out: &mut String, r: &Report, audience: Audience) {
    let p = &r.platform;
    // The verdict first (and last): what this machine can do, or the one
    // thing to fix.
    w!(out, "{}", r.verdict.line);
    w!(out);
    w!(
        out,
        "rocm-safe {} doctor (features: {})",
        r.crate_version,
        if r.features.is_empty() {
            "none, CPU only".to_owned()
        } else {
            r.features.join(", ")
        }
    );
    w!(out);
    w!(out, "Platform");
    let rows = [
        ("os", p.os.clone()),
        (
            "kernel",
            p.kernel.clone().unwrap_or_else(|| "unknown".into()),
        ),
        ("cpu", p.cpu.clone().unwrap_or_else(|| "unknown".into())),
        ("cores", p.cores.to_string()),
        (
            "memory",
            format!(
                "{} total, {} available",
                gib(p.memory_total_bytes),
                gib(p.memory_available_bytes)
            ),
        ),
        ("HIP runtime", lib(&p.hip_runtime)),
        ("  version", p.hip_runtime_version.to_string()),
        ("  driver", p.hip_driver_version.to_string()),
        ("CUDA driver", lib(&p.cuda_driver)),
        ("  version", p.cuda_driver_version.to_string()),
        ("NVRTC", lib(&p.nvrtc)),
    ];
    for (k, v) in rows {
        w!(out, "  {k:<12} {v}");
    }
    runtime_files(out, r);
    for m in &r.amdgpu_memory {
        let used = |u: Option<u64>| {
            u.map(|u| format!(" ({} used)", gib(Some(u))))
                .unwrap_or_default()
        };
        w!(
            out,
            "  {:<12} VRAM {}{}, GTT {}{}{}",
            format!("amdgpu {}", m.card),
            gib(m.vram_total_bytes),
            used(m.vram_used_bytes),
            gib(m.gtt_total_bytes),
            used(m.gtt_used_bytes),
            m.pci
                .as_ref()
                .map(|p| format!(" ({p})"))
                .unwrap_or_default()
        );
        w!(
            out,
            "  {:<12} TTM limit {}, amdgpu.gttsize {}",
            "",
            gib(m.ttm_limit_bytes),
            match m.amdgpu_gttsize_mib {
                Some(-1) => "default".to_owned(),
                Some(g) => format!("{g} MiB"),
                None => "unknown".to_owned(),
            }
        );
        if let (Some(o), Some(t)) = (m.hip_ordinal, m.runtime_total_bytes) {
            w!(
                out,
                "  {:<12} hip:{o} hipMemGetInfo: {} total, {} free",
                "",
                gib(Some(t)),
                gib(m.runtime_free_bytes)
            );
        }
        w!(out, "  {:<12} assessment: {:?}", "", m.assessment);
        if let Some(w) = &m.warning {
            w!(out, "  {:<12} WARNING: {w}", "");
        }
    }
    if let Some(o) = &r.gfx_override {
        let what = match (&o.arch, &o.error) {
            (Some(a), _) => format!(
                "the HIP runtime loads the {a} code object for every GPU ({})",
                match o.built_in {
                    Some(true) => "built in",
                    Some(false) => "NOT built in: rebuild with it",
                    None => "unknown whether built in",
                }
            ),
            (None, Some(e)) => e.clone(),
            (None, None) => "unknown".to_owned(),
        };
        w!(
            out,
            "  {:<12} {}={}: {what}",
            "gfx override",
            o.var,
            o.value
        );
    }
    hip_build(out, r, audience);
    w!(out);
    w!(out, "Environment");
    for e in &r.environment {
        w!(
            out,
            "  {:<30} {}",
            e.name,
            e.value.as_deref().unwrap_or("(unset)")
        );
    }
    if !r.advice.is_empty() {
        w!(out);
        w!(out, "Advice");
        for a in &r.advice {
            let mark = if a.ok { "ok    " } else { "CHANGE" };
            w!(
                out,
                "  {mark} [{}] {} = {}: {}",
                a.arch,
                a.variable,
                a.current.as_deref().unwrap_or("(unset)"),
                a.recommendation
            );
            w!(out, "         because {}", a.reason);
        }
    }
    w!(out);
    w!(out, "Self-tests");
    for t in &r.self_tests {
        w!(
            out,
            "  {}  {:<28} {:>8.1} ms  {}",
            verdict(t),
            t.name,
            t.millis,
            t.detail
        );
    }
    w!(out);
    w!(out, "Backends and devices");
    for b in &r.backends {
        match (&b.error, b.devices.is_empty()) {
            (Some(e), _) => w!(out, "  {:<5} {e}", b.backend),
            (None, true) => w!(out, "  {:<5} no devices", b.backend),
            (None, false) => {}
        }
        for d in &b.devices {
            let mem = match (d.memory_reported_total_bytes, &d.memory_info_error) {
                (Some(t), _) => format!(
                    "runtime reports {} total, {} free",
                    gib(Some(t)),
                    gib(d.memory_free_bytes)
                ),
                (None, Some(e)) => format!("memory figures unknown ({e})"),
                (None, None) => "memory figures unknown".to_owned(),
            };
            w!(
                out,
                "  {:<5} #{} {} ({}, {}, {} CUs; {mem})",
                b.backend,
                d.ordinal,
                d.name,
                d.arch,
                gib(Some(d.total_memory_bytes).filter(|&b| b > 0)),
                d.multiprocessors,
            );
            match &d.self_test {
                Some(t) => w!(
                    out,
                    "  {:<5}    {} kernel self-test {:.1} ms: {}",
                    "",
                    verdict(t),
                    t.millis,
                    t.detail
                ),
                None => w!(out, "  {:<5}    not selected (--device)", ""),
            }
        }
    }
    w!(out);
    w!(
        out,
        "Compatibility (operation x device, each checked against the CPU)"
    );
    for m in &r.matrix {
        let status = match &m.compat {
            Compat::Verified => "verified".to_owned(),
            Compat::FallsBack { to, why } => format!("falls back to {to} ({why})"),
            Compat::Skipped { why } => format!("skipped ({why})"),
            Compat::Fails { why } => format!("FAILS: {why}"),
        };
        let op = match &m.tier {
            Some(t) => format!("{} {t}", m.operation),
            None => m.operation.clone(),
        };
        w!(out, "  {op:<24} {:<8} {status}", m.device);
        if !m.detail.is_empty() {
            w!(out, "  {:<24} {:<8} {}", "", "", m.detail);
        }
    }
    w!(out);
    if r.all_passed() && r.usable() {
        w!(out, "All self-tests passed.");
    } else if r.usable() {
        w!(out, "A device self-test failed: its verified conversions fall back to the CPU (see above); please report this output.");
    } else {
        w!(out, "FAILED with no fallback left: do not trust this machine's results; please report this output.");
    }
    w!(out);
    w!(out, "{}", r.verdict.line);
}

fn runtime_files(out: &mut String, r: &Report) {
    w!(out);
    w!(out, "Libraries in use (this process)");
    for f in &r.runtime_files {
        if f.loaded {
            w!(
                out,
                "  {:<12} {}{}",
                f.library,
                f.real_path
                    .as_ref()
                    .or(f.path.as_ref())
                    .map_or("(path unknown)", |p| p.as_str()),
                f.version
                    .as_ref()
                    .map(|v| format!(", version {v}"))
                    .unwrap_or_default()
            );
            if let Some(how) = &f.found_by {
                w!(out, "  {:<12}   found: {how}", "");
            }
        } else {
            w!(
                out,
                "  {:<12} not loaded: {}",
                f.library,
                f.error.as_deref().unwrap_or("unknown")
            );
        }
    }
    for d in &r.duplicate_libraries {
        w!(out, "  WARNING: {} ({})", d.warning, d.files.join(", "));
    }
}

fn hip_build(out: &mut String, r: &Report, audience: Audience) {
    let h = &r.hip_build;
    w!(out);
    w!(out, "HIP kernels in this build");
    if !h.built {
        w!(
            out,
            "  not built ({})",
            match audience {
                Audience::Pip => "the package was built without `--features hip`",
                _ => "cargo feature `hip` is off",
            }
        );
    } else {
        let archs = if h.archs.is_empty() {
            "none (built with DOCS_RS set)".to_owned()
        } else {
            h.archs.join(", ")
        };
        w!(out, "  {:<12} {archs}", "archs");
        w!(
            out,
            "  {:<12} {}",
            "compiler",
            h.compiler.as_deref().unwrap_or("unknown")
        );
        if !h.left_out.is_empty() {
            w!(
                out,
                "  {:<12} {} (the compiler cannot target them; they need {})",
                "left out",
                h.left_out.join(", "),
                compiler_needed(&h.left_out[0])
            );
        }
    }
    for d in &h.devices {
        let state = if d.built {
            "built in".to_owned()
        } else {
            format!(
                "NOT built in: its kernels cannot load (needs {})",
                compiler_needed(&d.arch)
            )
        };
        w!(
            out,
            "  {:<12} {}: {state}",
            format!("hip:{}", d.ordinal),
            d.arch
        );
    }
    if let Some(cmd) = &h.rebuild_command {
        let label = if h.built {
            "rebuild with"
        } else {
            "run instead"
        };
        w!(out, "  {label:<12} {cmd}");
    }
}
