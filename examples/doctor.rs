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

use rocm_safe::diagnostics::{render_text, CollectOptions, DeviceSelector, Progress, Report};

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
        print!("{}", render_text(&report));
    }
    // 0 when everything present works or falls back as designed.
    if report.usable() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
