//! Flint example task in Zig: the SHA-256 of its input, as 64 hex digits.
//!
//! Reads stdin to its end in chunks (so the input never has to fit in memory at once),
//! writes the digest to stdout and the byte count to its log (stderr). With the argument
//! `--upper` the digits are upper-case. Any other argument is a usage error: exit code 64.
const std = @import("std");

pub fn main() !u8 {
    var args = try std.process.argsWithAllocator(std.heap.page_allocator);
    defer args.deinit();
    _ = args.skip(); // the job name
    var upper = false;
    const stderr = std.io.getStdErr().writer();
    while (args.next()) |arg| {
        if (std.mem.eql(u8, arg, "--upper")) {
            upper = true;
        } else {
            try stderr.print("sha256: unknown argument `{s}` (usage: sha256 [--upper])\n", .{arg});
            return 64;
        }
    }

    var hasher = std.crypto.hash.sha2.Sha256.init(.{});
    var buffer: [64 * 1024]u8 = undefined;
    const stdin = std.io.getStdIn().reader();
    var total: u64 = 0;
    while (true) {
        const n = try stdin.read(&buffer);
        if (n == 0) break;
        hasher.update(buffer[0..n]);
        total += n;
    }
    var digest: [32]u8 = undefined;
    hasher.final(&digest);

    const stdout = std.io.getStdOut().writer();
    if (upper) {
        try stdout.print("{}", .{std.fmt.fmtSliceHexUpper(&digest)});
    } else {
        try stdout.print("{}", .{std.fmt.fmtSliceHexLower(&digest)});
    }
    const index = std.process.getEnvVarOwned(std.heap.page_allocator, "FLINT_TASK_INDEX") catch "?";
    try stderr.print("sha256: task {s} hashed {d} bytes\n", .{ index, total });
    return 0;
}
