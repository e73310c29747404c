//! ExecutorTest, continued: corrupted plans are refused at parse time with an error naming the
//! JSON path, on every rank and without any communication (so no rank can hang); executions
//! the executor must refuse (wrong world size, NVLS, sizes the chunking does not divide,
//! foreign memory) fail before setup; the `MSCCLPP_CACHE_DIR` lookup prefers the best match.

use mscclpp::collectives::DataType;
use mscclpp::executor::cache::{find_plan_in, PlanQuery};
use mscclpp::executor::{ExecutionPlan, PacketType};
use mscclpp_framework::*;
use serde_json::{json, Value};

use super::executor::{exec_env, shipped_json};
use super::memory_channel::common::{is_gpu_build, ok};

/// A corruption: what it does to the plan, and a fragment the error must contain.
type Corruption = (&'static str, fn(&mut Value), &'static str);

fn op_index(v: &Value, g: usize, t: usize, name: &str) -> usize {
    v["gpus"][g]["threadblocks"][t]["ops"]
        .as_array()
        .and_then(|ops| ops.iter().position(|o| o["name"] == name))
        .unwrap_or(usize::MAX)
}

fn ops(v: &mut Value, g: usize, t: usize) -> &mut Vec<Value> {
    v["gpus"][g]["threadblocks"][t]["ops"]
        .as_array_mut()
        .expect("shipped plans have ops")
}

/// Corruptions of a shipped allgather_simple plan (signal/wait/put on memory channels).
const CORRUPTIONS: &[Corruption] = &[
    ("missing field", |v| {
        v.as_object_mut().map(|o| o.remove("protocol"));
    }, "at protocol: missing required field"),
    ("missing op field", |v| {
        let i = op_index(v, 1, 0, "signal");
        ops(v, 1, 0)[i].as_object_mut().map(|o| o.remove("channel_ids"));
    }, "gpus[1].threadblocks[0].ops[5].channel_ids: signal expects at least one channel"),
    ("wrong type", |v| {
        let i = op_index(v, 1, 0, "wait");
        ops(v, 1, 0)[i]["channel_ids"] = json!("zero");
    }, "at gpus[1].threadblocks[0].ops[6].channel_ids: invalid type: string"),
    ("thread block channel out of range", |v| {
        v["gpus"][0]["threadblocks"][0]["channels"][0]["channel_ids"] = json!([99]);
    }, "gpus[0].threadblocks[0].channels[0].channel_ids[0]: expected a memory channel id below"),
    ("op channel index out of range", |v| {
        let i = op_index(v, 0, 0, "signal");
        ops(v, 0, 0)[i]["channel_ids"] = json!([5]);
    }, ".ops[5].channel_ids[0]: expected an index below 1"),
    ("chunk out of range", |v| {
        let i = op_index(v, 0, 0, "put");
        ops(v, 0, 0)[i]["src_buff"][0]["index"] = json!(1000);
    }, "gpus[0].threadblocks[0].ops[3].src_buff[0]: chunks 1000..1001 lie outside rank 0's output buffer"),
    ("remote buffer out of range", |v| {
        let i = op_index(v, 0, 0, "put");
        ops(v, 0, 0)[i]["dst_buff"][0]["buffer_id"] = json!(9);
    }, ".ops[3].dst_buff[0].buffer_id: expected an index below 1"),
    ("unmatched wait", |v| {
        let i = op_index(v, 0, 0, "signal");
        ops(v, 0, 0).remove(i);
    }, "unmatched wait/signal: rank 1 waits 2 times on memory channel 0 (to rank 0), and rank 0 signals 1 times"),
    ("unknown op", |v| {
        ops(v, 0, 0)[0]["name"] = json!("teleport");
    }, "at gpus[0].threadblocks[0].ops[0].name: unknown variant `teleport`"),
    ("unknown protocol", |v| {
        v["protocol"] = json!("Fast");
    }, "at protocol: unknown variant `Fast`"),
    ("gpu id out of order", |v| {
        v["gpus"][1]["id"] = json!(0);
    }, "gpus[1].id: expected 1"),
    ("channel to itself", |v| {
        v["gpus"][0]["channels"][0]["connected_to"][0] = json!(0);
    }, "gpus[0].channels[0].connected_to[0]: expected a peer rank below"),
    ("threads per block", |v| {
        v["num_threads_per_block"] = json!(4096);
    }, "num_threads_per_block: expected 1..=1024, got 4096"),
    ("unbalanced semaphore", |v| {
        v["gpus"][0]["semaphores"] = json!([{"init_value": 1}]);
        ops(v, 0, 0).push(json!({"name": "sem_acquire", "semaphore_ids": [0]}));
    }, "device semaphore 0 of rank 0 is acquired and released unequally"),
    ("semaphore out of range", |v| {
        ops(v, 0, 0).push(json!({"name": "sem_release", "semaphore_ids": [3]}));
    }, "semaphore_ids[0]: expected a semaphore id below 0"),
    ("packets in a pipeline", |v| {
        ops(v, 0, 0).push(json!({"name": "pipeline", "iter_context": {"unit_size": 64, "num_chunks": 1},
            "ops": [{"name": "upkt", "src_buff": [{"type": "s", "index": 0, "size": 1}],
                     "dst_buff": [{"type": "o", "index": 0, "size": 1}]}]}));
    }, "ops[0].name: upkt inside a pipeline"),
    ("pws on a memory channel", |v| {
        let i = op_index(v, 0, 0, "put");
        ops(v, 0, 0)[i]["name"] = json!("pws");
    }, ".ops[3].channel_type: pws expects channel_type port, got memory"),
];

TEST!(ExecutorTest, BadPlans, |ctx| {
    let n = ctx.size();
    let text = match shipped_json("allgather_simple", n) {
        Ok(j) => j,
        Err(reason) => SKIP!("{}", reason),
    };
    let base: Value = ok!(serde_json::from_str(text), "the shipped plan is JSON");
    ok!(
        ExecutionPlan::from_json(text, ctx.rank()),
        "the uncorrupted plan parses"
    );
    for (what, corrupt, want) in CORRUPTIONS {
        let mut v = base.clone();
        corrupt(&mut v);
        let bad = v.to_string();
        match ExecutionPlan::from_json(&bad, ctx.rank()) {
            Ok(_) => EXPECT_TRUE!(false, "{what}: the corrupted plan was accepted"),
            Err(e) => {
                let msg = e.to_string();
                EXPECT_TRUE!(
                    msg.contains(want),
                    "{what}: expected the error to contain `{want}`, got: {msg}"
                );
            }
        }
    }
    // Not JSON at all, and a truncated file: the parser's position is named.
    for (what, bad) in [
        ("garbage", "{ not json"),
        ("truncated", &text[..text.len() / 2]),
    ] {
        match ExecutionPlan::from_json(bad, ctx.rank()) {
            Ok(_) => EXPECT_TRUE!(false, "{what}: accepted"),
            Err(e) => EXPECT_TRUE!(e.to_string().contains("line "), "{what}: {e}"),
        }
    }
    let missing = ExecutionPlan::from_file("/nonexistent/plan.json", 0);
    EXPECT_TRUE!(missing.is_err_and(|e| e
        .to_string()
        .contains("/nonexistent/plan.json: cannot read it")));
    // Barriers: every block naming barrier 0 must say how many blocks meet there.
    if let Ok(t) = shipped_json("allreduce_simple", n) {
        if n > 2 {
            let mut v: Value = ok!(serde_json::from_str(t), "JSON");
            let i = op_index(&v, 0, 0, "barrier");
            ops(&mut v, 0, 0)[i]["num_threadblocks"] = json!(2);
            let e = ExecutionPlan::from_json(&v.to_string(), ctx.rank());
            EXPECT_TRUE!(e.is_err_and(|e| e
                .to_string()
                .contains("num_threadblocks: barrier 0 is used by")));
        }
    }
});

TEST!(ExecutorTest, Refusals, |ctx| {
    let env = exec_env();
    let n = env.nranks;
    let (r, stream) = (env.rank, env.raw_stream());
    let buf: mscclpp::GpuBuffer<u8> = ok!(mscclpp::GpuBuffer::new(env.device, 1 << 16), "alloc");
    let run = |plan: &ExecutionPlan, bytes: usize, recv: usize| {
        // SAFETY: buf holds 64 KiB; every call below is refused before it touches memory.
        unsafe {
            env.exec.execute(
                r,
                buf.data(),
                buf.data(),
                bytes,
                recv,
                DataType::F32,
                plan,
                stream,
                PacketType::LL16,
            )
        }
    };
    let expect = |what: &str, res: mscclpp::Result<()>, want: &str| match res {
        Ok(()) => EXPECT_TRUE!(false, "{what}: ran"),
        Err(e) => EXPECT_TRUE!(
            e.to_string().contains(want),
            "{what}: expected `{want}` in: {e}"
        ),
    };
    // A plan for another world size.
    let other = if n == 2 { 4 } else { 2 };
    let p = ok!(
        ExecutionPlan::from_json(ok!(shipped_json("allreduce_simple", other), "plan"), 0),
        "parse"
    );
    if r == 0 {
        expect(
            "world size",
            run(&p, 256, 256),
            &format!("written for {other} ranks, but the communicator has {n}"),
        );
    }
    let Ok(text) = shipped_json("allreduce_simple", n) else {
        SKIP!("no shipped plan for {} ranks", n);
    };
    let plan = ok!(ExecutionPlan::from_json(text, ctx.rank()), "parse");
    expect(
        "unaligned size",
        run(&plan, 16 * n + 4, 16 * n + 4),
        "expected a multiple of buffer_alignment 16",
    );
    expect(
        "rank",
        // SAFETY: as in `run`: buf holds 64 KiB and the call is refused before it touches memory.
        unsafe {
            env.exec.execute(
                r + 1,
                buf.data(),
                buf.data(),
                256,
                256,
                DataType::F32,
                &plan,
                stream,
                PacketType::LL16,
            )
        },
        "expected this process's rank",
    );
    let host = vec![0u8; 4096];
    expect(
        "foreign memory",
        // SAFETY: as in `run`: buf holds 64 KiB and the call is refused before it touches memory.
        unsafe {
            env.exec.execute(
                r,
                host.as_ptr() as u64,
                host.as_ptr() as u64,
                16 * n,
                16 * n,
                DataType::F32,
                &plan,
                stream,
                PacketType::LL16,
            )
        },
        "expected memory allocated through mscclpp",
    );
    // A switch-channel op without its chunks is refused when parsing.
    let mut v: Value = ok!(serde_json::from_str(text), "JSON");
    ops(&mut v, 0, 0).push(json!({"name": "glres", "src_buff": [], "dst_buff": []}));
    match ExecutionPlan::from_json(&v.to_string(), ctx.rank()) {
        Ok(_) => EXPECT_TRUE!(false, "a glres without chunks parsed"),
        Err(e) => EXPECT_TRUE!(
            e.to_string().contains("src_buff: glres expects 1 chunks"),
            "glres without chunks: {e}"
        ),
    }
    // A shipped NVLS plan: refused on GPUs with the reason; integers refused everywhere.
    let nvls = ok!(
        ExecutionPlan::from_json(ok!(shipped_json("allreduce_nvls", n), "plan"), ctx.rank()),
        "an NVLS plan parses"
    );
    EXPECT_TRUE!(nvls.uses_switch_channels());
    if is_gpu_build() {
        expect(
            "NVLS on a GPU",
            run(&nvls, 256, 256),
            "switch channels (NVLS",
        );
    }
    expect(
        "NVLS i32",
        // SAFETY: buf holds 64 KiB; refused before it touches memory.
        unsafe {
            env.exec.execute(
                r,
                buf.data(),
                buf.data(),
                256,
                256,
                DataType::I32,
                &nvls,
                stream,
                PacketType::LL16,
            )
        },
        if is_gpu_build() {
            "switch channels (NVLS"
        } else {
            "reduce f32, f16 and bf16 only"
        },
    );
    // A switch chunk outside the buffer the channel binds.
    let mut v: Value = ok!(
        serde_json::from_str(ok!(shipped_json("allreduce_nvls", n), "plan")),
        "JSON"
    );
    let glres = ops(&mut v, 0, 0)
        .iter_mut()
        .find(|o| o["name"] == "glres")
        .expect("allreduce_nvls has a glres");
    glres["src_buff"][0]["index"] = json!(n);
    match ExecutionPlan::from_json(&v.to_string(), ctx.rank()) {
        Ok(_) => EXPECT_TRUE!(false, "a switch chunk past the buffer parsed"),
        Err(e) => EXPECT_TRUE!(
            e.to_string().contains(&format!(
                "input buffer (bound to the switch channel) of {n} chunks"
            )),
            "switch chunk past the buffer: {e}"
        ),
    }
    // LL8 packets cannot carry 8-byte elements.
    let ll = ok!(
        ExecutionPlan::from_json(ok!(shipped_json("allreduce_ll", n), "plan"), ctx.rank()),
        "parse"
    );
    expect(
        "LL8 f64",
        // SAFETY: as in `run`: buf holds 64 KiB and the call is refused before it touches memory.
        unsafe {
            env.exec.execute(
                r,
                buf.data(),
                buf.data(),
                256 * n,
                256 * n,
                DataType::F64,
                &ll,
                stream,
                PacketType::LL8,
            )
        },
        "do not fit",
    );
    EXPECT_EQ!(env.exec.cached_contexts(), 0, "refusals set nothing up");
});

TEST!(ExecutorTest, PlanCache, |ctx| {
    let n = ctx.size();
    let (Ok(a), Ok(b)) = (
        shipped_json("allreduce_simple", n),
        shipped_json("allreduce_ll", n),
    ) else {
        SKIP!("no shipped plans for {} ranks", n);
    };
    let dir = std::env::temp_dir().join(format!(
        "mscclpp-plan-cache-{}-{}",
        std::process::id(),
        ctx.rank()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    ok!(
        std::fs::create_dir_all(dir.join("default")),
        "creating {}",
        dir.display()
    );
    // The LL plan narrowed to small messages, the Simple one for all sizes, a broken file.
    let mut ll: Value = ok!(serde_json::from_str(b), "JSON");
    ll["max_message_size"] = json!(64 << 10);
    ok!(
        std::fs::write(dir.join("default/simple.json"), a),
        "writing"
    );
    ok!(
        std::fs::write(dir.join("ll_small.json"), ll.to_string()),
        "writing"
    );
    ok!(std::fs::write(dir.join("broken.json"), "{"), "writing");
    let q = |bytes: u64, in_place: bool, ppn: usize, coll: &'static str| PlanQuery {
        collective: coll,
        world_size: n,
        nranks_per_node: ppn,
        in_place,
        input_bytes: bytes,
        output_bytes: bytes,
        rank: ctx.rank(),
    };
    let unit = 16 * n as u64;
    let name = |p: Option<ExecutionPlan>| p.map(|p| p.name().to_string());
    EXPECT_EQ!(
        name(find_plan_in(&dir, &q(unit * 8, true, n, "allreduce"))),
        Some(format!("allreduce_ll_n{n}")),
        "small: the narrow LL plan"
    );
    EXPECT_EQ!(
        name(find_plan_in(&dir, &q(unit * 8192, true, n, "allreduce"))),
        Some(format!("allreduce_simple_n{n}")),
        "large: only the Simple plan's range"
    );
    EXPECT_EQ!(
        name(find_plan_in(&dir, &q(unit * 8, false, n, "allreduce"))),
        None,
        "out of place: none"
    );
    EXPECT_EQ!(
        name(find_plan_in(&dir, &q(unit * 8, true, 1, "allreduce"))),
        None,
        "other ranks per node"
    );
    EXPECT_EQ!(
        name(find_plan_in(&dir, &q(unit * 8, true, n, "allgather"))),
        None,
        "other collective"
    );
    EXPECT_EQ!(
        name(find_plan_in(&dir, &q(unit * 8 + 4, true, n, "allreduce"))),
        None,
        "size the chunks do not divide"
    );
    let _ = std::fs::remove_dir_all(&dir);
});
