//! `cargo run --release --example doctor [-- --json]`
//!
//! Tells you what this machine is, which GPU runtimes rocm-safe can see, and
//! whether the CPU conversion and fingerprint paths pass their self-tests.
//! Exit status: 0 when everything present works or falls back as designed,
//! 1 when a check fails with no fallback left, 2 on a usage error.

use std::process::ExitCode;

use rocm_safe::diagnostics::{Compat, Library, Report, Verdict};

fn gib(bytes: Option<u64>) -> String {
    bytes.map_or_else(
        || "unknown".to_owned(),
        |b| format!("{:.1} GiB", b as f64 / (1u64 << 30) as f64),
    )
}

fn lib(l: &Option<Library>) -> String {
    match l {
        Some(l) => format!(
            "found ({}{})",
            l.soname,
            l.path
                .as_ref()
                .map(|p| format!(" -> {p}"))
                .unwrap_or_default()
        ),
        None => "not found".to_owned(),
    }
}

fn print_table(r: &Report) {
    let p = &r.platform;
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
        ("CUDA driver", lib(&p.cuda_driver)),
        ("NVRTC", lib(&p.nvrtc)),
    ];
    for (k, v) in rows {
        println!("  {k:<12} {v}");
    }
    for m in &r.amdgpu_memory {
        println!(
            "  {:<12} VRAM {}, GTT {}{}",
            format!("amdgpu {}", m.card),
            gib(m.vram_total_bytes),
            gib(m.gtt_total_bytes),
            m.pci
                .as_ref()
                .map(|p| format!(" ({p})"))
                .unwrap_or_default()
        );
        if let Some(w) = &m.warning {
            println!("  {:<12} WARNING: {w}", "");
        }
    }
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
        let v = match t.verdict {
            Verdict::Pass => "PASS",
            Verdict::Fail => "FAIL",
        };
        println!("  {v}  {:<28} {:>8.1} ms  {}", t.name, t.millis, t.detail);
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
            let v = match d.self_test.verdict {
                Verdict::Pass => "PASS",
                Verdict::Fail => "FAIL",
            };
            println!(
                "  {:<5} #{} {} ({}, {}, {} CUs)  {v} kernel self-test {:.1} ms: {}",
                b.backend,
                d.ordinal,
                d.name,
                d.arch,
                gib(Some(d.total_memory_bytes).filter(|&b| b > 0)),
                d.multiprocessors,
                d.self_test.millis,
                d.self_test.detail
            );
        }
    }
    println!();
    println!("Compatibility (operation x device, each checked against the CPU)");
    for m in &r.matrix {
        let status = match &m.compat {
            Compat::Verified => "verified".to_owned(),
            Compat::FallsBack { to, why } => format!("falls back to {to} ({why})"),
            Compat::Fails { why } => format!("FAILS: {why}"),
        };
        println!("  {:<24} {:<8} {status}", m.operation, m.device);
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
}

fn main() -> ExitCode {
    const USAGE: &str = "usage: doctor [--json] [--arch GFX]  (--arch: advice for a gfx target even without a visible device)";
    let mut json = false;
    let mut archs = Vec::new();
    let mut args = std::env::args().skip(1);
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
    let mut report = Report::collect();
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
