//! The default logger: installed on the first record, honouring MSCCLPP_LOG_LEVEL,
//! MSCCLPP_LOG_SUBSYS and MSCCLPP_LOG_FILE (`%p` = pid).

#[test]
fn default_logger_filters_by_level_and_subsystem_into_the_file() {
    let dir = std::env::temp_dir().join(format!("mscclpp-logger-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    // Set before anything reads the environment (it is read once per process).
    std::env::set_var("MSCCLPP_LOG_LEVEL", "INFO");
    std::env::set_var("MSCCLPP_LOG_SUBSYS", "INIT,NET");
    std::env::set_var("MSCCLPP_LOG_FILE", dir.join("log.%p"));
    mscclpp::log_info!("INIT", "rank {} ready", 7);
    mscclpp::log_warn!("NET", "a warning");
    mscclpp::log_trace!("INIT", "too verbose");
    mscclpp::log_warn!("PROXY", "not a listed subsystem");
    assert!(
        mscclpp::logger::init(),
        "no application logger: the default one is installed"
    );
    log::logger().flush();
    let path = dir.join(format!("log.{}", std::process::id()));
    let text = std::fs::read_to_string(&path).expect("the log file");
    let _ = std::fs::remove_dir_all(&dir);
    let pid = std::process::id().to_string();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2, "{text}");
    assert!(
        lines[0].ends_with(&format!(":{pid} MSCCLPP INFO [INIT] rank 7 ready")),
        "{text}"
    );
    assert!(
        lines[1].ends_with(&format!(":{pid} MSCCLPP WARN [NET] a warning")),
        "{text}"
    );
}
