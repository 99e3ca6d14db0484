//! `cargo run --release --example doctor [-- --json] [--device N|BACKEND:N] [--arch GFX]`
//!
//! Tells you what this machine is, which GPU runtimes rocm-safe can see
//! (with their versions and memory figures), and whether the CPU and device
//! conversion paths, the staged copy and each conv3d tier pass their
//! self-tests on a small case. A progress bar is drawn on stderr while the
//! self-tests run, only when stderr is a terminal and `--json` is off.
//! Exit status: 0 when everything present works or falls back as designed,
//! 1 when a check fails with no fallback left, 2 on a usage error or a
//! `--device` that selects no device.

use std::io::IsTerminal;
use std::process::ExitCode;

use rocm_safe::diagnostics::{
    compiler_needed, CollectOptions, Compat, DeviceSelector, Library, Progress, Report, SelfTest,
    Verdict,
};

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

fn print_table(r: &Report) {
    let p = &r.platform;
    // The verdict first (and last): what this machine can do, or the one
    // thing to fix.
    println!("{}", r.verdict.line);
    println!();
    println!(
        "rocm-safe {} doctor (features: {})",
        r.crate_version,
        if r.features.is_empty() {
            "none, CPU only".to_owned()
        } else {
            r.features.join(", ")
        }
    );
    println!();
    println!("Platform");
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
        println!("  {k:<12} {v}");
    }
    print_runtime_files(r);
    for m in &r.amdgpu_memory {
        let used = |u: Option<u64>| {
            u.map(|u| format!(" ({} used)", gib(Some(u))))
                .unwrap_or_default()
        };
        println!(
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
        println!(
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
            println!(
                "  {:<12} hip:{o} hipMemGetInfo: {} total, {} free",
                "",
                gib(Some(t)),
                gib(m.runtime_free_bytes)
            );
        }
        println!("  {:<12} assessment: {:?}", "", m.assessment);
        if let Some(w) = &m.warning {
            println!("  {:<12} WARNING: {w}", "");
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
        println!("  {:<12} {}={}: {what}", "gfx override", o.var, o.value);
    }
    print_hip_build(r);
    println!();
    println!("Environment");
    for e in &r.environment {
        println!(
            "  {:<30} {}",
            e.name,
            e.value.as_deref().unwrap_or("(unset)")
        );
    }
    if !r.advice.is_empty() {
        println!();
        println!("Advice");
        for a in &r.advice {
            let mark = if a.ok { "ok    " } else { "CHANGE" };
            println!(
                "  {mark} [{}] {} = {}: {}",
                a.arch,
                a.variable,
                a.current.as_deref().unwrap_or("(unset)"),
                a.recommendation
            );
            println!("         because {}", a.reason);
        }
    }
    println!();
    println!("Self-tests");
    for t in &r.self_tests {
        println!(
            "  {}  {:<28} {:>8.1} ms  {}",
            verdict(t),
            t.name,
            t.millis,
            t.detail
        );
    }
    println!();
    println!("Backends and devices");
    for b in &r.backends {
        match (&b.error, b.devices.is_empty()) {
            (Some(e), _) => println!("  {:<5} {e}", b.backend),
            (None, true) => println!("  {:<5} no devices", b.backend),
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
            println!(
                "  {:<5} #{} {} ({}, {}, {} CUs; {mem})",
                b.backend,
                d.ordinal,
                d.name,
                d.arch,
                gib(Some(d.total_memory_bytes).filter(|&b| b > 0)),
                d.multiprocessors,
            );
            match &d.self_test {
                Some(t) => println!(
                    "  {:<5}    {} kernel self-test {:.1} ms: {}",
                    "",
                    verdict(t),
                    t.millis,
                    t.detail
                ),
                None => println!("  {:<5}    not selected (--device)", ""),
            }
        }
    }
    println!();
    println!("Compatibility (operation x device, each checked against the CPU)");
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
        println!("  {op:<24} {:<8} {status}", m.device);
        if !m.detail.is_empty() {
            println!("  {:<24} {:<8} {}", "", "", m.detail);
        }
    }
    println!();
    if r.all_passed() && r.usable() {
        println!("All self-tests passed.");
    } else if r.usable() {
        println!("A device self-test failed: its verified conversions fall back to the CPU (see above); please report this output.");
    } else {
        println!("FAILED with no fallback left: do not trust this machine's results; please report this output.");
    }
    println!();
    println!("{}", r.verdict.line);
}

fn print_runtime_files(r: &Report) {
    println!();
    println!("Libraries in use (this process)");
    for f in &r.runtime_files {
        if f.loaded {
            println!(
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
                println!("  {:<12}   found: {how}", "");
            }
        } else {
            println!(
                "  {:<12} not loaded: {}",
                f.library,
                f.error.as_deref().unwrap_or("unknown")
            );
        }
    }
    for d in &r.duplicate_libraries {
        println!("  WARNING: {} ({})", d.warning, d.files.join(", "));
    }
}

fn print_hip_build(r: &Report) {
    let h = &r.hip_build;
    println!();
    println!("HIP kernels in this build");
    if !h.built {
        println!("  not built (cargo feature `hip` is off)");
    } else {
        let archs = if h.archs.is_empty() {
            "none (built with DOCS_RS set)".to_owned()
        } else {
            h.archs.join(", ")
        };
        println!("  {:<12} {archs}", "archs");
        println!(
            "  {:<12} {}",
            "compiler",
            h.compiler.as_deref().unwrap_or("unknown")
        );
        if !h.left_out.is_empty() {
            println!(
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
        println!("  {:<12} {}: {state}", format!("hip:{}", d.ordinal), d.arch);
    }
    if let Some(cmd) = &h.rebuild_command {
        let label = if h.built {
            "rebuild with"
        } else {
            "run instead"
        };
        println!("  {label:<12} {cmd}");
    }
}

const USAGE: &str = "\
usage: doctor [--json] [--device N | --device BACKEND:N] [--arch GFX]
  --json              print the report as one JSON document (schema_version 5)
  --device N          self-test and run the matrix only on ordinal N of each
                      backend that has one (hip:N, cuda:N; the host device is 0)
  --device BACKEND:N  only on that device (host:0, hip:1, cuda:0)
  --arch GFX          advice for a gfx target even without a visible device
exit status: 0 when everything present works or falls back as designed,
1 when a check fails with no fallback left, 2 on a usage error or a --device
that selects no device";

/// A progress bar on stderr over the self-tests.
fn progress_bar() -> impl FnMut(&Progress) {
    let bar = indicatif::ProgressBar::new(0);
    let style = indicatif::ProgressStyle::with_template(
        "{spinner} self-tests [{bar:30}] {pos}/{len} {msg}",
    )
    .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
    .progress_chars("=> ");
    bar.set_style(style);
    let mut ticking = false;
    move |p: &Progress| {
        bar.set_length(p.total as u64);
        if !ticking {
            // Only once the length is known (no empty 0/0 frame first).
            bar.enable_steady_tick(std::time::Duration::from_millis(120));
            ticking = true;
        }
        bar.set_position(p.done as u64);
        if p.done >= p.total {
            bar.finish_and_clear();
        } else {
            bar.set_message(p.step.clone());
        }
    }
}

fn main() -> ExitCode {
    let mut json = false;
    let mut archs = Vec::new();
    let mut options = CollectOptions::default();
    // Arguments that are not UTF-8 are usage errors, never a panic.
    let mut args = std::env::args_os()
        .skip(1)
        .map(|a| a.into_string().unwrap_or_else(|bad| format!("{bad:?}")));
    while let Some(a) = args.next() {
        match a.as_str() {
            "--json" => json = true,
            "--arch" => match args.next() {
                Some(v) if v.starts_with("gfx") => archs.push(v),
                _ => {
                    eprintln!("doctor: --arch needs a gfx target such as gfx1151\n{USAGE}");
                    return ExitCode::from(2);
                }
            },
            "--device" => match args.next().map(|v| v.parse::<DeviceSelector>()) {
                Some(Ok(sel)) => options.device = Some(sel),
                _ => {
                    eprintln!(
                        "doctor: --device needs an ordinal (1) or backend:ordinal (hip:0)\n{USAGE}"
                    );
                    return ExitCode::from(2);
                }
            },
            "-h" | "--help" => {
                println!("{USAGE}");
                return ExitCode::SUCCESS;
            }
            other => {
                eprintln!("doctor: unknown argument {other:?}\n{USAGE}");
                return ExitCode::from(2);
            }
        }
    }
    let collected = if !json && std::io::stderr().is_terminal() {
        Report::collect_with(&options, &mut progress_bar())
    } else {
        Report::collect_with(&options, &mut |_| {})
    };
    let mut report = match collected {
        Ok(r) => r,
        Err(e) => {
            // One line: the selection matched no device.
            eprintln!("doctor: {e}");
            return ExitCode::from(2);
        }
    };
    for arch in &archs {
        if !report.advice.iter().any(|a| &a.arch == arch) {
            let more = rocm_safe::diagnostics::advise(arch, &report.environment);
            report.advice.extend(more);
        }
    }
    if json {
        match serde_json::to_string_pretty(&report) {
            Ok(s) => println!("{s}"),
            Err(e) => {
                eprintln!("doctor: cannot serialise the report: {e}");
                return ExitCode::FAILURE;
            }
        }
    } else {
        print_table(&report);
    }
    // 0 when everything present works or falls back as designed.
    if report.usable() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
