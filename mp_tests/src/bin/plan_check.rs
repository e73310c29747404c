//! `plan_check FILE...`: parses and validates execution plans without running them (every
//! rank's part), printing a one-line summary per plan or the error naming the JSON path.
//! Exit status 0 when every plan is valid, 1 otherwise, 2 on bad usage.

use mscclpp::executor::ExecutionPlan;

fn main() {
    let files: Vec<String> = std::env::args().skip(1).collect();
    if files.is_empty() || files.iter().any(|f| f == "-h" || f == "--help") {
        eprintln!("usage: plan_check FILE...  (validates execution plans for every rank)");
        std::process::exit(2);
    }
    let mut bad = 0;
    for f in &files {
        match ExecutionPlan::from_file(f, 0) {
            Ok(p) => {
                let blocks: Vec<usize> = (0..p.world_size())
                    .map(|r| {
                        ExecutionPlan::from_file(f, r)
                            .map(|q| q.num_threadblocks())
                            .unwrap_or(0)
                    })
                    .collect();
                println!(
                    "ok   {f}: {} `{}` {} {} ranks, {}, thread blocks per rank {blocks:?}, {} threads, sizes {}..={} bytes",
                    p.collective(),
                    p.name(),
                    p.protocol(),
                    p.world_size(),
                    if p.is_in_place() { "in place" } else { "out of place" },
                    p.num_threads_per_block(),
                    p.min_message_size(),
                    p.max_message_size(),
                );
            }
            Err(e) => {
                bad += 1;
                println!("FAIL {f}: {e}");
            }
        }
    }
    std::process::exit(if bad > 0 { 1 } else { 0 });
}
