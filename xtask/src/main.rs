//! Project tasks. `cargo xtask gpu-bundle` builds the test and bench binaries
//! for the nvidia accelerator and gathers them with a run script into
//! `gpu-bundle/` (git-ignored), ready to carry to the GPU machine.
fn main() {
    eprintln!("usage: cargo xtask gpu-bundle");
    std::process::exit(2);
}
