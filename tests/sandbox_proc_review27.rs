//! review27: what a sandboxed program reaches through its own /proc.
#[tokio::test]
async fn review27_proc_probe() {
    let ws = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(ws.path().join(".gaffer")).unwrap();
    let script = std::fs::read_to_string("/tmp/review27/probe.sh").unwrap();
    let mut cmd = tokio::process::Command::new("bash");
    cmd.arg("-c").arg(script).current_dir(ws.path());
    let spec = gaffer::sandbox::Spec::new(ws.path());
    let how =
        gaffer::sandbox::confine(&mut cmd, &spec, gaffer::sandbox::Setting::Required).unwrap();
    eprintln!("confinement: {how:?}");
    let out = cmd.output().await.unwrap();
    eprintln!(
        "status {:?}\n--- stdout\n{}\n--- stderr\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
