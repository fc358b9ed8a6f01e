fn main() {
    napi_build::setup();
    // The portable addon loads llama.cpp's shared libraries from its own
    // directory, wherever the package was installed.
    println!("cargo:rerun-if-env-changed=CARGO_FEATURE_PREBUILT");
    if std::env::var_os("CARGO_FEATURE_PREBUILT").is_some() {
        match std::env::var("CARGO_CFG_TARGET_OS").as_deref() {
            Ok("linux") => println!("cargo:rustc-cdylib-link-arg=-Wl,-rpath,$ORIGIN"),
            Ok("macos") => println!("cargo:rustc-cdylib-link-arg=-Wl,-rpath,@loader_path"),
            _ => {}
        }
    }
}
