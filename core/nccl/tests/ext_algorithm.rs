//! `mscclppNcclRegisterAlgorithm` (include/mscclpp_nccl_ext.h), host backend: every bad
//! registration gives `ncclInvalidArgument` and a message naming what was expected; a
//! registered all-reduce (example 10's algorithm as `extern "C"` callbacks on the host
//! helpers) is chosen by `ncclAllReduce` for the calls its `select` takes, on communicators
//! created after the registration only, with the INFO line naming it and exact results; a
//! failing `launch` fails the call; the header compiles as C with the Rust layouts and the
//! library exports the function.
//!
//! The environment (log file) is read once per process, so the in-process part is one test
//! that sets the log variables before anything reads them.

mod common;

use std::ffi::{c_int, c_void, CStr, CString};
use std::mem::{offset_of, size_of};
use std::process::Command;
use std::ptr::null_mut;
use std::sync::atomic::{AtomicUsize, Ordering};

use mscclpp_nccl::abi;
use mscclpp_nccl::exports::*;
use mscclpp_nccl::exports_ops::*;
use mscclpp_nccl::ext_algorithm::{
    mscclppNcclRegisterAlgorithm, AlgorithmDesc, CallInfo, Context, ALGORITHM_VERSION,
};

type Comm = *mut c_void;
const FLOAT: c_int = 7;
const INT32: c_int = 2;
const SUM: c_int = 0;
/// The largest call `ext_test_sum` takes.
const MAX_BYTES: usize = 64 << 10;

fn ok(r: c_int, what: &str) {
    assert_eq!(r, abi::SUCCESS, "{what} -> {r}: {}", last_error());
}

fn last_error() -> String {
    // SAFETY: a C string owned by this thread until its next call.
    unsafe { CStr::from_ptr(ncclGetLastError(null_mut())) }
        .to_string_lossy()
        .into_owned()
}

/// Launches of `ext_test_sum`; the user pointer of its registration.
static LAUNCHES: AtomicUsize = AtomicUsize::new(0);

unsafe extern "C" fn select_sum(call: *const CallInfo, _user: *mut c_void) -> c_int {
    // SAFETY: the library's call info, valid during the callback.
    let c = unsafe { &*call };
    c_int::from(c.collective == 0 && c.datatype == FLOAT && c.op == SUM && c.bytes <= MAX_BYTES)
}

/// Example 10's algorithm on the host helpers: barrier, own input into the own plain scratch,
/// barrier, every rank's scratch summed into the output, barrier.
unsafe extern "C" fn launch_sum(
    call: *const CallInfo,
    ctx: *const Context,
    stream: *mut c_void,
    user: *mut c_void,
) -> c_int {
    // SAFETY: the library's call info and context, valid during the callback.
    let (c, x) = unsafe { (&*call, &*ctx) };
    assert_eq!(x.host_backend, 1, "the host backend runs these tests");
    assert!(stream.is_null(), "the host backend's stream is NULL");
    // SAFETY: the registration's user pointer is LAUNCHES.
    unsafe { &*(user as *const AtomicUsize) }.fetch_add(1, Ordering::Relaxed);
    let barrier = x.host_barrier.expect("the host backend's barrier");
    let scratch = |r: usize| {
        // SAFETY: peer_bases holds nranks entries, mapped here.
        (unsafe { *x.peer_bases.add(r) } + x.plain_offset) as usize as *mut f32
    };
    // SAFETY: the helpers get the context they were given; the buffers hold `count` f32 and
    // the plain scratch more (select caps the size); the barriers order every access.
    unsafe {
        let r = barrier(ctx, 0);
        if r != abi::SUCCESS {
            return r;
        }
        std::ptr::copy(c.sendbuff as *const f32, scratch(x.rank as usize), c.count);
        let r = barrier(ctx, 0);
        if r != abi::SUCCESS {
            return r;
        }
        for i in 0..c.count {
            let s: f32 = (0..x.nranks as usize).map(|r| *scratch(r).add(i)).sum();
            *(c.recvbuff as *mut f32).add(i) = s;
        }
        barrier(ctx, 0)
    }
}

unsafe extern "C" fn select_none(_: *const CallInfo, _: *mut c_void) -> c_int {
    0
}

/// Takes the all-reduces of int32 (and fails them).
unsafe extern "C" fn select_int32(call: *const CallInfo, _: *mut c_void) -> c_int {
    // SAFETY: the library's call info.
    c_int::from(unsafe { (*call).datatype } == INT32)
}

unsafe extern "C" fn launch_fails(
    _: *const CallInfo,
    _: *const Context,
    _: *mut c_void,
    _: *mut c_void,
) -> c_int {
    abi::INVALID_USAGE
}

/// A valid descriptor of an all-reduce `name` (the CString must outlive the call).
fn desc(name: &CString) -> AlgorithmDesc {
    AlgorithmDesc {
        name: name.as_ptr(),
        select: Some(select_none),
        launch: Some(launch_fails),
        ..AlgorithmDesc::initializer()
    }
}

fn register(d: &AlgorithmDesc) -> c_int {
    // SAFETY: a valid descriptor whose callbacks are functions of this program.
    unsafe { mscclppNcclRegisterAlgorithm(d) }
}

fn expect_invalid(r: c_int, what: &str, message: &str) {
    let msg = last_error();
    assert_eq!(r, abi::INVALID_ARGUMENT, "{what}: {msg}");
    assert!(
        msg.starts_with("mscclppNcclRegisterAlgorithm: ") && msg.contains(message),
        "{what}: expected {message:?} in {msg:?}"
    );
}

fn registration_errors() {
    // SAFETY: NULL is what is tested.
    let r = unsafe { mscclppNcclRegisterAlgorithm(std::ptr::null()) };
    expect_invalid(
        r,
        "NULL desc",
        "desc is NULL: expected a mscclppNcclAlgorithm",
    );
    let name = CString::new("ext_test_declines_all").expect("a C string");
    let good = desc(&name);
    let size = size_of::<AlgorithmDesc>();
    let cases: [(&str, AlgorithmDesc, String); 10] = [
        (
            "version 2",
            AlgorithmDesc { version: 2, ..good },
            format!("version 2 and size {size}: expected version 1"),
        ),
        (
            "size 8",
            AlgorithmDesc { size: 8, ..good },
            format!("size 8: expected version 1 (MSCCLPP_NCCL_ALGORITHM_VERSION) and size {size}"),
        ),
        (
            "collective 4",
            AlgorithmDesc {
                collective: 4,
                ..good
            },
            "collective 4: expected one of mscclppNcclAllReduce (0), mscclppNcclAllGather (1)"
                .into(),
        ),
        (
            "collective -1",
            AlgorithmDesc {
                collective: -1,
                ..good
            },
            "collective -1: expected one of".into(),
        ),
        (
            "NULL name",
            AlgorithmDesc {
                name: std::ptr::null(),
                ..good
            },
            "name is NULL".into(),
        ),
        (
            "empty name",
            AlgorithmDesc {
                name: c"".as_ptr(),
                ..good
            },
            "name \"\" has 0 bytes: expected 1 to 255".into(),
        ),
        (
            "non-UTF-8 name",
            AlgorithmDesc {
                name: c"\xff\xfe".as_ptr(),
                ..good
            },
            "name is not UTF-8".into(),
        ),
        (
            "NULL select",
            AlgorithmDesc {
                select: None,
                ..good
            },
            "`ext_test_declines_all`: select NULL and launch set: expected both callbacks".into(),
        ),
        (
            "NULL launch",
            AlgorithmDesc {
                launch: None,
                ..good
            },
            "select set and launch NULL: expected both callbacks".into(),
        ),
        (
            "a native name",
            AlgorithmDesc {
                name: c"rsag".as_ptr(),
                ..good
            },
            "allreduce algorithm `rsag`: expected a name that is not a native algorithm's".into(),
        ),
    ];
    for (what, d, message) in &cases {
        expect_invalid(register(d), what, message);
    }
    let long = CString::new("x".repeat(256)).expect("a C string");
    expect_invalid(
        register(&desc(&long)),
        "a 256-byte name",
        "has 256 bytes: expected 1 to 255",
    );
    ok(register(&good), "registering ext_test_declines_all");
    expect_invalid(
        register(&good),
        "the same name again",
        "allreduce algorithm `ext_test_declines_all`: expected a name not registered yet",
    );
    // The same name for another collective is fine.
    ok(
        register(&AlgorithmDesc {
            collective: 1,
            ..good
        }),
        "the name for all-gather",
    );
}

fn value(r: usize, i: usize) -> f32 {
    ((r * 31 + i) % 1000) as f32
}

/// Out-of-place all-reduces of `count` f32 on both communicators in one group; checks the
/// sums exactly. Returns GroupEnd's code.
fn all_reduce(comms: &[Comm], count: usize) -> c_int {
    let sends: Vec<Vec<f32>> = (0..2)
        .map(|r| (0..count).map(|i| value(r, i)).collect())
        .collect();
    let mut recvs = vec![vec![0f32; count]; 2];
    // SAFETY: every buffer outlives the group (the host backend completes it in GroupEnd).
    let end = unsafe {
        ok(ncclGroupStart(), "ncclGroupStart");
        for (r, c) in comms.iter().enumerate() {
            let rc = ncclAllReduce(
                sends[r].as_ptr() as *const c_void,
                recvs[r].as_mut_ptr() as *mut c_void,
                count,
                FLOAT,
                SUM,
                *c as *mut _,
                null_mut(),
            );
            ok(rc, "ncclAllReduce");
        }
        ncclGroupEnd()
    };
    if end == abi::SUCCESS {
        for (r, got) in recvs.iter().enumerate() {
            for (i, v) in got.iter().enumerate() {
                assert_eq!(
                    *v,
                    value(0, i) + value(1, i),
                    "{count} f32: rank {r}, element {i}"
                );
            }
        }
    }
    end
}

#[test]
fn registered_all_reduce_runs_through_nccl_all_reduce_on_later_communicators() {
    let dir = std::env::temp_dir().join(format!("mscclpp-nccl-ext-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("creating the log folder");
    let log = dir.join("log");
    // The only in-process test of this binary (the other one runs a C program): nothing else
    // reads the environment meanwhile.
    std::env::set_var("MSCCLPP_LOG_LEVEL", "INFO");
    std::env::set_var("MSCCLPP_LOG_SUBSYS", "COLL");
    std::env::set_var("MSCCLPP_LOG_FILE", &log);

    let before = common::comms_in_group(2);
    registration_errors();
    let sum = CString::new("ext_test_sum").expect("a C string");
    ok(
        register(&AlgorithmDesc {
            name: sum.as_ptr(),
            user: &LAUNCHES as *const AtomicUsize as *mut c_void,
            select: Some(select_sum),
            launch: Some(launch_sum),
            ..AlgorithmDesc::initializer()
        }),
        "registering ext_test_sum",
    );
    let fails = CString::new("ext_test_fails").expect("a C string");
    ok(
        register(&AlgorithmDesc {
            select: Some(select_int32),
            ..desc(&fails)
        }),
        "registering ext_test_fails",
    );
    // Communicators created before the registration do not have it.
    ok(all_reduce(&before, 1024), "all-reduce before");
    assert_eq!(LAUNCHES.load(Ordering::Relaxed), 0);
    let after = common::comms_in_group(2);
    // 4 KiB and 64 KiB: ext_test_sum; 256 KiB: the native choice.
    let mut want = 0;
    for count in [1024, 16 * 1024, 64 * 1024] {
        ok(
            all_reduce(&after, count),
            &format!("all-reduce of {count} f32"),
        );
        want += if count * 4 <= MAX_BYTES { 2 } else { 0 };
        assert_eq!(LAUNCHES.load(Ordering::Relaxed), want, "{count} f32");
    }
    // A launch that fails fails the call, naming the algorithm.
    let mut ints = [[1i32; 3]; 2];
    // SAFETY: the buffers outlive the group (completed or failed in GroupEnd).
    let end = unsafe {
        ok(ncclGroupStart(), "ncclGroupStart");
        for (c, b) in after.iter().zip(ints.iter_mut()) {
            let p = b.as_mut_ptr() as *mut c_void;
            ok(
                ncclAllReduce(p, p, 3, INT32, SUM, *c as *mut _, null_mut()),
                "ncclAllReduce of int32",
            );
        }
        ncclGroupEnd()
    };
    let msg = last_error();
    assert_eq!(end, abi::INVALID_USAGE, "a failing launch: {msg}");
    assert!(
        msg.contains("allreduce algorithm `ext_test_fails`: launch returned 5"),
        "{msg}"
    );
    for c in before.into_iter().chain(after) {
        // SAFETY: live handles from init.
        ok(unsafe { ncclCommDestroy(c as *mut _) }, "ncclCommDestroy");
    }

    let text = std::fs::read_to_string(&log).expect("reading the log");
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        text.contains(
            "registered allreduce algorithm `ext_test_sum` (mscclppNcclRegisterAlgorithm)"
        ),
        "{text}"
    );
    let runs: Vec<&str> = text.lines().filter(|l| l.contains(" runs ")).collect();
    for rank in 0..2 {
        let line = format!(
            "rank {rank}: allreduce of 4096 bytes runs ext_test_sum (mscclppNcclRegisterAlgorithm)"
        );
        assert_eq!(
            runs.iter().filter(|l| l.contains(&line)).count(),
            1,
            "{line:?} once (the communicators created before run natives); log:\n{text}"
        );
        let native = format!("rank {rank}: allreduce of 262144 bytes runs ");
        assert!(
            runs.iter()
                .any(|l| l.contains(&native) && !l.contains("ext_test")),
            "rank {rank}: a native algorithm at 256 KiB; log:\n{text}"
        );
    }
}

/// `(C expression, Rust value)` for the size and the given fields' offsets of a struct:
/// `layout!(c_name, RustType, c_field => rust_field, ...)`.
macro_rules! layout {
    ($c:literal, $t:ty, $($cf:ident => $rf:ident),*) => {
        [(concat!("sizeof(", $c, ")"), size_of::<$t>())]
            .into_iter()
            .chain([$((concat!("offsetof(", $c, ", ", stringify!($cf), ")"), offset_of!($t, $rf))),*])
    };
}

/// The header compiled as C: its layouts equal the Rust types', its initializer, and the
/// library's exported function answering a NULL desc.
#[test]
fn header_compiles_as_c_with_the_rust_layouts_and_the_library_exports_the_function() {
    let facts: Vec<(&str, usize)> = layout!("mscclppNcclAlgorithm", AlgorithmDesc,
        version => version, collective => collective, name => name, user => user,
        select => select, launch => launch)
    .chain(
        layout!("mscclppNcclCallInfo", CallInfo, datatype => datatype, op => op,
        root => root, nranks => nranks, count => count, bytes => bytes, sendbuff => sendbuff,
        recvbuff => recvbuff),
    )
    .chain(
        layout!("mscclppNcclContext", Context, nranks => nranks, device => device,
        hostBackend => host_backend, peerBases => peer_bases, semaphores => semaphores,
        flags => flags, nflags => nflags, maxSemBlocks => max_sem_blocks,
        maxWaitingBlocks => max_waiting_blocks, llOffset => ll_offset,
        llHalfBytes => ll_half_bytes, plainOffset => plain_offset, plainBytes => plain_bytes,
        hostBarrier => host_barrier, hostSignal => host_signal, hostWait => host_wait,
        internal => internal),
    )
    .chain([
        ("sizeof(mscclppNcclCollective_t)", 4),
        ("mscclppNcclBroadcast", 3),
        ("a.size", size_of::<AlgorithmDesc>()),
        ("a.version", ALGORITHM_VERSION as usize),
        ("a.collective", 0),
        (
            "a.name == NULL && a.user == NULL && a.select == NULL && a.launch == NULL",
            1,
        ),
        (
            "mscclppNcclRegisterAlgorithm(NULL)",
            abi::INVALID_ARGUMENT as usize,
        ),
        (
            "strstr(ncclGetLastError(NULL), \"desc is NULL\") != NULL",
            1,
        ),
    ])
    .collect();
    let prints: String = facts.iter().map(|(e, _)| format!("  P({e});\n")).collect();
    let src = common::out_dir().join("ext_layout.c");
    let program = format!(
        "#include <stdio.h>\n#include <string.h>\n#include \"mscclpp_nccl_ext.h\"\n\
         #define P(x) printf(#x \" %ld\\n\", (long)(x))\n\
         int main(void) {{\n  mscclppNcclAlgorithm a = MSCCLPP_NCCL_ALGORITHM_INITIALIZER;\n\
         {prints}  return 0;\n}}\n"
    );
    std::fs::write(&src, program).expect("writing the C program");
    let exe = common::out_dir().join("ext_layout");
    common::compile_c(&[src.to_str().expect("a UTF-8 path")], &exe, false);
    let out = Command::new(&exe).output().expect("run ext_layout");
    assert!(out.status.success(), "ext_layout failed: {out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    let got: Vec<(&str, usize)> = text
        .lines()
        .filter_map(|l| {
            let (k, v) = l.rsplit_once(' ')?;
            Some((k, v.parse().ok()?))
        })
        .collect();
    assert_eq!(
        got, facts,
        "the C header's facts vs the Rust types':\n{text}"
    );
}
