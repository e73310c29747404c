"""PyTorch with its NCCL watchdog over libmscclpp_nccl (LD_PRELOAD): the last rank dies in the
middle of an all-reduce; every survivor must see an error.

Started by faults_gpu.sh with RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT. The victim prints
"VICTIM rank=R dies_at_us=T" and kills itself; a survivor prints "SURVIVOR rank=R
error_at_us=T what=..." when its all-reduce (or the watchdog) reports the failure. The
watchdog (TORCH_NCCL_ASYNC_ERROR_HANDLING) polls ncclCommGetAsyncError and aborts the
communicator; its teardown may end the process: the driver then takes the process's exit time.
"""
import datetime
import os
import signal
import time

import torch
import torch.distributed as dist


def now_us():
    return time.time_ns() // 1000


def main():
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dev = torch.device("cuda:0")
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl", rank=rank, world_size=world, device_id=dev,
                            timeout=datetime.timedelta(seconds=60))
    x = torch.ones(1 << 24, device=dev)
    for _ in range(3):
        dist.all_reduce(x)
    torch.cuda.synchronize()
    if rank == world - 1:
        dist.all_reduce(x, async_op=True)
        time.sleep(0.002)
        print(f"VICTIM rank={rank} dies_at_us={now_us()}", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    try:
        for _ in range(100):
            w = dist.all_reduce(x, async_op=True)
            w.wait()
        torch.cuda.synchronize()
        # The calls enqueued before the death was seen may end (the abort word stops their
        # kernels, their results undefined, as NCCL's after an abort) before the watchdog's
        # next poll: the failure then surfaces at the next call, which a training loop makes.
        dist.all_reduce(x)
        torch.cuda.synchronize()
        print(f"SURVIVOR rank={rank} error_at_us=0 what=all-reduces completed", flush=True)
    except Exception as e:  # the watchdog's abort surfaces here
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        print(f"SURVIVOR rank={rank} error_at_us={now_us()} what={msg}", flush=True)
        os._exit(0)


if __name__ == "__main__":
    main()
