//! Link flags for the cdylib.

fn main() {
    // `-z nodelete` keeps the fake loaded once it has been dlopen'ed, like a real driver
    // library in practice. nvml-wrapper dlcloses the library whenever an `Nvml` is dropped or
    // its init fails; without this flag the fake would be unloaded and its process-wide state
    // (the init-attempt counter behind `fail_count`, the clock) would silently reset.
    if std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux") {
        println!("cargo::rustc-cdylib-link-arg=-Wl,-z,nodelete");
    }
    println!("cargo::rerun-if-changed=build.rs");
}
