use super::*;

fn parse(args: &[&str]) -> Result<Command, UsageError> {
    let args: Vec<String> = args.iter().map(|arg| arg.to_string()).collect();
    Command::parse(&args)
}

#[test]
fn parses_every_command() {
    assert_eq!(parse(&["noop"]), Ok(Command::Noop));
    assert_eq!(parse(&["echo"]), Ok(Command::Echo));
    assert_eq!(
        parse(&["sleep", "250"]),
        Ok(Command::Sleep(Duration::from_millis(250)))
    );
    assert_eq!(
        parse(&["after", "3000", "print", "5"]),
        Ok(Command::After(
            Duration::from_millis(3000),
            Box::new(Command::Print(5))
        ))
    );
    assert_eq!(
        parse(&["burn", "20"]),
        Ok(Command::Burn(Duration::from_millis(20)))
    );
    assert_eq!(parse(&["spin"]), Ok(Command::Spin));
    assert_eq!(
        parse(&["alloc", "3"]),
        Ok(Command::Alloc { bytes: 3 * MIB })
    );
    assert_eq!(parse(&["exit", "7"]), Ok(Command::Exit(7)));
    assert_eq!(parse(&["panic"]), Ok(Command::Panic));
    assert_eq!(parse(&["print", "70000"]), Ok(Command::Print(70_000)));
    assert_eq!(parse(&["eprint", "0"]), Ok(Command::Eprint(0)));
    assert_eq!(parse(&["env", "a", "b"]), Ok(Command::Env));
    assert_eq!(parse(&["info"]), Ok(Command::Info));
    assert_eq!(
        parse(&["read", "/files/in.txt"]),
        Ok(Command::Read("/files/in.txt".into()))
    );
    assert_eq!(
        parse(&["write", "out file"]),
        Ok(Command::Write("out file".into()))
    );
    assert_eq!(parse(&["recurse"]), Ok(Command::Recurse));
    assert_eq!(parse(&["facts"]), Ok(Command::Facts));
    assert_eq!(
        parse(&["http-n", "http://h/", "2"]),
        Ok(Command::Http(egress::HttpCommand::Sequential {
            url: "http://h/".into(),
            count: 2
        }))
    );
    assert_eq!(
        parse(&["after", "5", "http-get", "http://h/"]),
        Ok(Command::After(
            Duration::from_millis(5),
            Box::new(Command::Http(egress::HttpCommand::Get("http://h/".into())))
        ))
    );
}

#[test]
fn paths_are_taken_as_given() {
    // Even a path that cannot exist: failing on it is the runtime's business, not argv's.
    assert_eq!(parse(&["read", ""]), Ok(Command::Read(String::new())));
    assert_eq!(
        parse(&["write", "../x/./7"]),
        Ok(Command::Write("../x/./7".into()))
    );
}

#[test]
fn rejects_missing_paths() {
    assert_eq!(
        parse(&["read"]),
        Err(UsageError::MissingPath { command: "read" })
    );
    assert_eq!(
        parse(&["write"]),
        Err(UsageError::MissingPath { command: "write" })
    );
    assert_eq!(
        UsageError::MissingPath { command: "read" }.to_string(),
        "read needs a path"
    );
}

#[test]
fn rejects_missing_and_unknown_commands() {
    assert_eq!(parse(&[]), Err(UsageError::NoCommand));
    assert_eq!(
        parse(&["Noop"]),
        Err(UsageError::UnknownCommand("Noop".into()))
    );
}

#[test]
fn rejects_bad_numbers() {
    assert_eq!(
        parse(&["sleep"]),
        Err(UsageError::MissingNumber { command: "sleep" })
    );
    assert_eq!(
        parse(&["slow-first", "20"]),
        Ok(Command::SlowFirst(Duration::from_millis(20)))
    );
    assert_eq!(
        parse(&["slow-first"]),
        Err(UsageError::MissingNumber {
            command: "slow-first"
        })
    );
    assert_eq!(
        parse(&["print", "-1"]),
        Err(UsageError::BadNumber {
            command: "print",
            value: "-1".into()
        })
    );
    assert_eq!(
        parse(&["exit", "x"]),
        Err(UsageError::BadNumber {
            command: "exit",
            value: "x".into()
        })
    );
    let too_big = (usize::MAX / MIB + 1).to_string();
    assert_eq!(
        parse(&["alloc", &too_big]),
        Err(UsageError::BadNumber {
            command: "alloc",
            value: too_big.clone()
        })
    );
}

#[test]
fn rejects_extra_arguments() {
    assert_eq!(
        parse(&["noop", "1"]),
        Err(UsageError::ExtraArguments { command: "noop" })
    );
    assert_eq!(
        parse(&["exit", "1", "2"]),
        Err(UsageError::ExtraArguments { command: "exit" })
    );
    assert_eq!(
        parse(&["read", "a", "b"]),
        Err(UsageError::ExtraArguments { command: "read" })
    );
    assert_eq!(
        parse(&["write", "a", "b"]),
        Err(UsageError::ExtraArguments { command: "write" })
    );
    assert_eq!(
        parse(&["recurse", "1"]),
        Err(UsageError::ExtraArguments { command: "recurse" })
    );
    assert_eq!(
        parse(&["facts", "1"]),
        Err(UsageError::ExtraArguments { command: "facts" })
    );
}

#[test]
fn usage_names_every_command() {
    for name in [
        "noop",
        "echo",
        "sleep",
        "after",
        "burn",
        "slow-first",
        "spin",
        "alloc",
        "exit",
        "panic",
        "print",
        "eprint",
        "env",
        "info",
        "read",
        "write",
        "recurse",
        "facts",
        "http-get",
        "http-post",
        "http-req",
        "http-n",
        "http-par",
    ] {
        assert!(USAGE.contains(name), "{name} missing from USAGE");
    }
}

#[test]
fn repeat_writes_exactly_count_bytes_in_bounded_chunks() {
    for count in [0, 1, CHUNK as u64 - 1, CHUNK as u64, 3 * CHUNK as u64 + 5] {
        let mut out = Vec::new();
        repeat(b'x', count, |chunk| {
            assert!(!chunk.is_empty() && chunk.len() <= CHUNK);
            out.extend_from_slice(chunk);
            Ok(())
        })
        .unwrap();
        assert_eq!(out.len() as u64, count);
        assert!(out.iter().all(|&b| b == b'x'));
    }
}

#[test]
fn env_report_sorts_flint_vars_and_lists_args() {
    let vars = [
        ("FLINT_TASK_INDEX", "1"),
        ("PATH", "/bin"),
        ("FLINT_ATTEMPT", "0"),
        ("FLINT_JOB_ID", "j"),
        ("FLINT_JOB", "k"),
        ("FLINT_JOB1", "l"),
    ];
    let args = ["env".to_string(), "a b".to_string(), "c".to_string()];
    assert_eq!(
        env_report(vars, &args),
        "FLINT_ATTEMPT=0\nFLINT_JOB=k\nFLINT_JOB1=l\nFLINT_JOB_ID=j\nFLINT_TASK_INDEX=1\n\
         ARGS=env a b c\n"
    );
}

#[test]
fn info_json_escapes_the_job_id() {
    let info = TaskInfo::from_vars([
        ("FLINT_JOB_ID", "a\"b\\c\n"),
        ("FLINT_TASK_INDEX", "2"),
        ("FLINT_TASK_COUNT", "4"),
        ("FLINT_ATTEMPT", "1"),
    ])
    .unwrap();
    assert_eq!(
        info_json(&info),
        r#"{"job":"a\"b\\c\n","index":2,"count":4,"attempt":1}"#
    );
}
