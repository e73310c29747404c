//! Unit tests of verdict combination and the verdict wire format.

use mscclpp_framework::{combine_verdicts, SingleProcessWorld, Verdict, World};

fn skip(r: &str) -> Verdict {
    Verdict::Skipped(r.to_owned())
}

#[test]
fn combine_fails_if_any_rank_failed() {
    use Verdict::*;
    assert_eq!(combine_verdicts(&[Passed, Failed, Passed]), Failed);
    assert_eq!(combine_verdicts(&[skip("x"), Passed, Failed]), Failed);
    assert_eq!(combine_verdicts(&[Failed]), Failed);
}

#[test]
fn combine_skips_with_the_first_reason_if_none_failed() {
    use Verdict::*;
    assert_eq!(
        combine_verdicts(&[Passed, skip("no ib"), skip("no gpu")]),
        skip("no ib")
    );
    assert_eq!(combine_verdicts(&[skip("a")]), skip("a"));
}

#[test]
fn combine_passes_only_if_all_passed() {
    use Verdict::*;
    assert_eq!(combine_verdicts(&[Passed, Passed, Passed, Passed]), Passed);
    assert_eq!(combine_verdicts(&[]), Passed);
}

#[test]
fn single_process_world_is_rank_0_of_1_and_echoes() {
    let w = SingleProcessWorld;
    assert_eq!((w.rank(), w.size()), (0, 1));
    assert_eq!(w.combine(&skip("r")), Ok(skip("r")));
    assert_eq!(w.combine(&Verdict::Failed), Ok(Verdict::Failed));
}

#[test]
fn verdict_bytes_round_trip() {
    for v in [
        Verdict::Passed,
        Verdict::Failed,
        skip(""),
        skip("needs 2 GPUs: ünïcode"),
    ] {
        let bytes = v.to_bytes();
        assert_eq!(
            Verdict::from_bytes(&bytes),
            Ok(v.clone()),
            "bytes {bytes:?}"
        );
    }
    // The layout is explicit: version 1, tag, u32 LE length, reason.
    assert_eq!(Verdict::Failed.to_bytes(), vec![1, 1, 0, 0, 0, 0]);
    assert_eq!(skip("ab").to_bytes(), vec![1, 2, 2, 0, 0, 0, b'a', b'b']);
}

#[test]
fn malformed_verdict_bytes_are_errors() {
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (vec![], "header"),
        (vec![1, 0, 0, 0, 0], "header"),
        (vec![2, 0, 0, 0, 0, 0], "version"),
        (vec![1, 9, 0, 0, 0, 0], "tag"),
        (vec![1, 2, 5, 0, 0, 0, b'a'], "5-byte"),
        (vec![1, 2, 0, 0, 0, 0, b'a'], "0-byte"),
        (vec![1, 2, 255, 255, 255, 255], "4294967295-byte"),
        (vec![1, 0, 1, 0, 0, 0, b'x'], "no reason"),
        (vec![1, 2, 2, 0, 0, 0, 0xff, 0xfe], "UTF-8"),
    ];
    for (bytes, expected) in cases {
        match Verdict::from_bytes(&bytes) {
            Ok(v) => panic!("{bytes:?} decoded to {v:?}, expected an error"),
            Err(e) => assert!(
                e.contains(expected),
                "{bytes:?}: error '{e}' lacks '{expected}'"
            ),
        }
    }
}
