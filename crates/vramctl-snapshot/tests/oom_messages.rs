//! Real OOM messages, as users pasted them in public issue threads (each cites where it came
//! from), and two composed from the format in PyTorch's source where no pasted one was found.
//! Each is checked for its figures and for the cause the figures alone support.

use vramctl_snapshot::oom_cause::Cause;
use vramctl_snapshot::oom_message::{
    Framework, HeldThen, Holder, MAX_MESSAGE_BYTES, explain, parse,
};

const MIB: f64 = 1_048_576.0;
const GIB: f64 = 1_073_741_824.0;

/// Within the two decimals the message prints.
fn about(got: Option<u64>, want: f64) {
    #[allow(clippy::cast_precision_loss)]
    let got = got.expect("a figure") as f64;
    assert!((got - want).abs() <= want * 0.005 + 1.0, "{got} vs {want}");
}

/// github.com/pytorch/pytorch/issues/16417 (comment of 2024-03-13): 194.87 MiB reserved
/// but unallocated, a 22 MiB request, 11 MiB free: the memory is PyTorch's, in pieces.
const FRAGMENTED: &str = "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 22.00 MiB. GPU 0 has a total capacity of 23.65 GiB of which 11.06 MiB is free. Including non-PyTorch memory, this process has 23.60 GiB memory in use. Of the allocated memory 22.90 GiB is allocated by PyTorch, and 194.87 MiB is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)";

/// github.com/murong-xu/CADS/issues/4: 22.78 GiB asked, 12.73 free + 9.35 unallocated.
const SHORT: &str = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 22.78 GiB. GPU 0 has a total capacity of 31.47 GiB of which 12.73 GiB is free. Including non-PyTorch memory, this process has 18.73 GiB memory in use. Of the allocated memory 9.08 GiB is allocated by PyTorch, and 9.35 GiB is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)";

/// github.com/wxian3/NeuroLens/issues/2: more than the GPU (the 2.1-era "capacty" typo).
const LARGER_THAN_GPU: &str = "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 55.57 GiB. GPU 0 has a total capacty of 12.00 GiB of which 9.02 GiB is free. Of the allocated memory 984.52 MiB is allocated by PyTorch, and 463.48 MiB is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting max_split_size_mb to avoid fragmentation.  See documentation for Memory Management and PYTORCH_CUDA_ALLOC_CONF";

/// github.com/pytorch/pytorch/issues/59778: the ≤ 2.0 format.
const OLD_FORMAT: &str = "CUDA out of memory. Tried to allocate 2.26 GiB (GPU 0; 6.00 GiB total capacity; 781.59 MiB already allocated; 3.03 GiB free; 1.24 GiB reserved in total by PyTorch)";

/// Composed from reportProcessMemoryInfo's and malloc's format strings in
/// c10/cuda/CUDACachingAllocator.cpp (no pasted message with other processes was found):
/// two other processes hold 100 GiB of an H200.
const OTHERS: &str = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 40.00 GiB. GPU 0 has a total capacity of 139.81 GiB of which 12.50 GiB is free. Process 4242 has 60.00 GiB memory in use. Process 4343 has 40.00 GiB memory in use. Including non-PyTorch memory, this process has 27.30 GiB memory in use. Of the allocated memory 25.00 GiB is allocated by PyTorch, and 1.50 GiB is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)";

/// Composed the same way, with `set_per_process_memory_fraction`'s "allowed": the issue's
/// case (16 GiB allowed, 12 GiB live, a 6 GiB request, the H200 nearly empty).
const ALLOWED: &str = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 6.00 GiB. GPU 0 has a total capacity of 139.81 GiB of which 127.29 GiB is free. Including non-PyTorch memory, this process has 12.52 GiB memory in use. 16.00 GiB allowed; Of the allocated memory 12.00 GiB is allocated by PyTorch, and 0 bytes is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)";

/// github.com/jax-ml/jax/issues/13428.
const JAX: &str = "jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory while trying to allocate 6291456 bytes.\nBufferAssignment OOM Debugging.";

/// github.com/zzw922cn/Automatic_Speech_Recognition/issues/78: BFC stats and the tensor.
const TF: &str = "2018-06-08 17:26:00.908082: I tensorflow/core/common_runtime/bfc_allocator.cc:680] Stats: \nLimit:                 10625279591\nInUse:                  7350513920\nMaxInUse:               7464792320\n2018-06-08 17:26:00.908130: W tensorflow/core/framework/op_kernel.cc:1202] OP_REQUIRES failed at tile_ops.cc:123 : Resource exhausted: OOM when allocating tensor with shape[16,1,892800,8,4,2,2] and type float on /job:localhost/replica:0/task:0/device:GPU:0 by allocator GPU_0_bfc";

#[test]
fn pytorch_figures_are_read() {
    let m = parse(FRAGMENTED).expect("a PyTorch OOM");
    assert_eq!(m.framework, Framework::Pytorch);
    let f = &m.figures;
    assert_eq!(f.device, Some(0));
    about(f.tried_bytes, 22.0 * MIB);
    about(f.total_bytes, 23.65 * GIB);
    about(f.free_bytes, 11.06 * MIB);
    about(f.this_process_bytes, 23.60 * GIB);
    about(f.allocated_bytes, 22.90 * GIB);
    about(f.reserved_unallocated_bytes, 194.87 * MIB);
    assert_eq!(f.hint.as_deref(), Some("expandable_segments:True"));
    let old = parse(OLD_FORMAT).expect("old format");
    about(old.figures.reserved_bytes, 1.24 * GIB);
    about(old.figures.allocated_bytes, 781.59 * MIB);
    let o = parse(OTHERS).expect("others");
    assert_eq!(o.figures.other_processes.len(), 2);
    assert_eq!(o.figures.other_processes[0].pid, 4242);
    about(
        parse(ALLOWED).expect("allowed").figures.allowed_bytes,
        16.0 * GIB,
    );
}

#[test]
fn each_message_gets_the_cause_its_figures_support() {
    let cause = |text: &str| explain(&parse(text).expect("parsed"), None).cause;
    assert_eq!(cause(FRAGMENTED), Some(Cause::Fragmentation));
    assert_eq!(cause(SHORT), Some(Cause::Shortage));
    assert_eq!(cause(LARGER_THAN_GPU), Some(Cause::Shortage));
    assert_eq!(cause(OLD_FORMAT), Some(Cause::Shortage));
    assert_eq!(cause(OTHERS), Some(Cause::OtherProcess));
    assert_eq!(cause(ALLOWED), Some(Cause::ProcessLimit));
    assert_eq!(cause(JAX), None, "a JAX message alone supports no cause");
    assert_eq!(cause(TF), Some(Cause::Shortage));
}

#[test]
fn no_fix_is_guessed_from_a_message() {
    // The message suggests expandable_segments; nothing here checks that it works, so the
    // verdict gives no allocator setting and says what it cannot tell.
    let v = explain(&parse(FRAGMENTED).expect("parsed"), None);
    assert_eq!(v.fix, None);
    assert!(
        v.cannot_tell.iter().any(|c| c.contains("replay")),
        "{:?}",
        v.cannot_tell
    );
    assert!(v.cannot_tell.iter().any(|c| c.contains("leak")));
    // The limit case names what to raise it to: 12 GiB live + 6 GiB.
    let v = explain(&parse(ALLOWED).expect("parsed"), None);
    let fix = v.fix.expect("a fix");
    assert!(fix.contains("18.00 GiB"), "{fix}");
    assert!(
        !fix.contains("127"),
        "never the device's free memory: {fix}"
    );
    // Other processes are named.
    let v = explain(&parse(OTHERS).expect("parsed"), None);
    assert!(v.fix.expect("a fix").contains("PID 4242"));
}

#[test]
fn tensorflow_tensor_bytes_come_from_shape_and_type() {
    let m = parse(TF).expect("TF");
    assert_eq!(m.framework, Framework::Tensorflow);
    assert_eq!(
        m.figures.tried_bytes,
        Some(16 * 892_800 * 8 * 4 * 2 * 2 * 4)
    );
    assert_eq!(m.figures.bfc_limit_bytes, Some(10_625_279_591));
    assert_eq!(
        m.figures.logged_at.as_deref(),
        Some("2018-06-08 17:26:00.908082")
    );
}

#[test]
fn the_history_names_who_held_the_gpu_when_the_message_does_not() {
    // SHORT without its "this process" figure would not know of others; with the history
    // the holders are named.
    let text = "CUDA out of memory. Tried to allocate 30.00 GiB. GPU 0 has a total capacity of 79.10 GiB of which 2.00 GiB is free. Of the allocated memory 20.00 GiB is allocated by PyTorch, and 1.00 GiB is reserved by PyTorch but unallocated.";
    let m = parse(text).expect("parsed");
    assert_eq!(explain(&m, None).cause, Some(Cause::Shortage));
    let then = HeldThen {
        at_unix_ms: 0,
        device_total_bytes: Some(84_934_656_000),
        holders: vec![
            Holder {
                pid: 77,
                bytes: 22 << 30,
                user: Some("me".into()),
                command: Some("python train.py".into()),
                container: None,
            },
            Holder {
                pid: 99,
                bytes: 50 << 30,
                user: Some("bob".into()),
                command: Some("python serve.py".into()),
                container: None,
            },
        ],
    };
    let v = explain(&m, Some(&then));
    assert_eq!(v.cause, Some(Cause::OtherProcess), "{}", v.why);
    let fix = v.fix.expect("fix");
    assert!(
        fix.contains("PID 99 (50.00 GiB, bob python serve.py)"),
        "{fix}"
    );
    assert!(
        !fix.contains("PID 77"),
        "the OOM's own process is not an other: {fix}"
    );
}

#[test]
fn hostile_and_foreign_text_is_no_message() {
    assert!(parse("").is_none());
    assert!(parse("Segmentation fault (core dumped)").is_none());
    assert!(parse("Tried to allocate lots").is_none());
    // Past the bound nothing is read: a message after 256 KiB of padding is not seen.
    let padded = format!("{}{}", "x".repeat(MAX_MESSAGE_BYTES), SHORT);
    assert!(parse(&padded).is_none());
    // A figure past any GPU's size is not read as one (no overflow, no message).
    assert!(parse("Tried to allocate 99999999999999999999.00 GiB. GPU 0 has a total capacity of 1.00 GiB of which 0 bytes is free.").is_none());
}
