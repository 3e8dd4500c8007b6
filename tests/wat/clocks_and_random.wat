;; A p1 command that writes 40 bytes to stdout: the realtime and monotonic clocks
;; (clock_time_get), 16 bytes of random_get, and the monotonic clock again after a 2 s
;; sleep in poll_oneoff. The probe of deterministic mode: tests/e2e/determinism.rs runs it on
;; a cluster, the executor's sandbox tests in process.
(module
  (import "wasi_snapshot_preview1" "clock_time_get"
    (func $clock (param i32 i64 i32) (result i32)))
  (import "wasi_snapshot_preview1" "random_get" (func $random (param i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "poll_oneoff"
    (func $poll (param i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_write"
    (func $write (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (func (export "_start")
    (drop (call $clock (i32.const 0) (i64.const 1) (i32.const 1024)))
    (drop (call $clock (i32.const 1) (i64.const 1) (i32.const 1032)))
    (drop (call $random (i32.const 1040) (i32.const 16)))
    (i32.store8 (i32.const 8) (i32.const 0))
    (i32.store (i32.const 16) (i32.const 1))
    (i64.store (i32.const 24) (i64.const 2000000000))
    (drop (call $poll (i32.const 0) (i32.const 64) (i32.const 1) (i32.const 128)))
    (drop (call $clock (i32.const 1) (i64.const 1) (i32.const 1056)))
    (i32.store (i32.const 200) (i32.const 1024))
    (i32.store (i32.const 204) (i32.const 40))
    (drop (call $write (i32.const 1) (i32.const 200) (i32.const 1) (i32.const 208)))))
