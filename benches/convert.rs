//! Conversion benches (being built).
fn main() {}
