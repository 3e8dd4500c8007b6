use super::*;

fn wat(text: &str) -> Vec<u8> {
    wat::parse_str(text).unwrap_or_else(|e| panic!("bad test WAT: {e}\n{text}"))
}

fn refused(text: &str) -> Rejection {
    check(&wat(text), &Limits::DEFAULT).expect_err("should be refused")
}

const START: &str = r#"(func (export "_start"))"#;

#[test]
fn a_wasi_command_within_the_limits_is_accepted() {
    let module = format!(
        r#"(module (memory 2) (memory 1) (memory 1) (memory 1)
             (table 100000 funcref) (table 1 funcref) (table 1 funcref) (table 1 funcref)
             (table 1 funcref) (table 1 funcref) (table 1 funcref) (table 1 funcref)
             {START})"#
    );
    let shape = check(&wat(&module), &Limits::DEFAULT).unwrap();
    assert_eq!(shape.initial_memory_bytes, 2 * PAGE);
    assert!(!shape.component);
}

#[test]
fn every_limit_is_named_when_it_is_passed() {
    let cases = [
        (
            format!("(module (memory 1) (memory 1) (memory 1) (memory 1) (memory 1) {START})"),
            Limit::Memories,
            "at most 4 memories",
        ),
        (
            format!("(module {} {START})", "(table 1 funcref) ".repeat(9)),
            Limit::Tables,
            "at most 8 tables",
        ),
        (
            format!("(module (table 10000000 funcref) {START})"),
            Limit::TableElements,
            "at most 100000 elements",
        ),
        (
            format!("(module (table 100001 funcref) {START})"),
            Limit::TableElements,
            "100001 elements",
        ),
        (
            format!("(module (memory i64 1) {START})"),
            Limit::Validation,
            "memory64",
        ),
        (
            format!("(module (memory 1 1 shared) {START})"),
            Limit::Validation,
            "threads",
        ),
        (
            r#"(module (memory 1) (func (export "_start") (drop (i32.atomic.load (i32.const 0)))))"#
                .to_owned(),
            Limit::Validation,
            "not threads",
        ),
        (
            format!("(module (table 1 externref) {START})"),
            Limit::Validation,
            "not threads",
        ),
        (
            "(module (memory 1))".to_owned(),
            Limit::Start,
            "no `_start`",
        ),
        (
            r#"(module (func (export "_start") (param i32)))"#.to_owned(),
            Limit::Start,
            "`() -> ()`",
        ),
        (
            r#"(module (func (export "_start") (result i32) i32.const 0))"#.to_owned(),
            Limit::Start,
            "`() -> ()`",
        ),
        (
            r#"(module (global (export "_start") i32 (i32.const 0)))"#.to_owned(),
            Limit::Start,
            "not as a function",
        ),
    ];
    for (module, limit, words) in cases {
        let rejection = refused(&module);
        assert_eq!(rejection.limit, limit, "{module}: {rejection}");
        assert!(
            rejection.message.contains(words),
            "{module}: `{rejection}` should contain `{words}`"
        );
    }
}

#[test]
fn an_imported_start_is_judged_by_its_type() {
    let ok = r#"(module (import "m" "f" (func $f)) (export "_start" (func $f)))"#;
    check(&wat(ok), &Limits::DEFAULT).unwrap();
    let bad = r#"(module (type (func (param i32))) (import "m" "f" (func $f (type 0)))
                 (func) (export "_start" (func $f)))"#;
    assert_eq!(refused(bad).limit, Limit::Start);
}

#[test]
fn an_initial_memory_beyond_the_largest_task_is_refused() {
    let limits = Limits {
        max_memory_bytes: 64 << 20,
        ..Limits::DEFAULT
    };
    let module = wat(&format!("(module (memory 1025) {START})"));
    let rejection = check(&module, &limits).unwrap_err();
    assert_eq!(rejection.limit, Limit::InitialMemory);
    assert!(rejection.message.contains("at most 64 MiB"), "{rejection}");
    check(&wat(&format!("(module (memory 1024) {START})")), &limits).unwrap();
}

#[test]
fn instance_state_is_bounded() {
    let limits = Limits {
        instance_bytes: 64 << 10,
        ..Limits::DEFAULT
    };
    let globals = "(global i32 (i32.const 0)) ".repeat(5000);
    let rejection = check(&wat(&format!("(module {globals} {START})")), &limits).unwrap_err();
    assert_eq!(rejection.limit, Limit::InstanceSize, "{rejection}");
    assert!(rejection.message.contains("5000 globals"), "{rejection}");
}

#[test]
fn what_is_not_wasm_is_refused_as_such() {
    for bytes in [
        &b"#!/bin/sh"[..],
        b"\0asm\x01\0\0\0\x01\x05garbage",
        b"\0asm\x01\0",
    ] {
        assert_eq!(
            check(bytes, &Limits::DEFAULT).unwrap_err().limit,
            Limit::Validation
        );
    }
}

#[test]
fn components_count_their_modules_together() {
    let module =
        |memories: usize| format!("(core module {} {START})", "(memory 1) ".repeat(memories));
    let ok = format!("(component {} {})", module(2), module(2));
    let shape = check(&wat(&ok), &Limits::DEFAULT).unwrap();
    assert!(shape.component);
    let instances = format!(
        "(component (core module $m {START}) {})",
        "(core instance (instantiate $m)) ".repeat(17)
    );
    assert_eq!(
        check(&wat(&instances), &Limits::DEFAULT).unwrap_err().limit,
        Limit::Instances
    );
    let nested = format!("(component {})", module(5));
    assert_eq!(
        check(&wat(&nested), &Limits::DEFAULT).unwrap_err().limit,
        Limit::Memories
    );
}
