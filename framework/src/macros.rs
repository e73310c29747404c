//! The exported macros: test registration (`TEST!`, `PERF_TEST!`), assertions (`EXPECT_*!`,
//! `ASSERT_*!`), `FAIL!` and `SKIP!`.

/// Registers a test `Suite.Name`.
///
/// ```ignore
/// TEST!(Suite, Name, |ctx| { EXPECT_EQ!(ctx.size(), 1); });
/// TEST!(Suite, Name, |ctx, fx: &mut Suite| { fx.check(ctx); });   // Suite: Fixture
/// ```
#[macro_export]
macro_rules! TEST {
    ($suite:ident, $name:ident, |$ctx:pat_param, $fx:ident : &mut $fty:ty| $body:expr $(,)?) => {
        $crate::__register_test!(false, $suite, $name, |$ctx, $fx: &mut $fty| $body);
    };
    ($suite:ident, $name:ident, |$ctx:pat_param| $body:expr $(,)?) => {
        $crate::__register_test!(false, $suite, $name, |$ctx| $body);
    };
    // The same two forms with the context's type written out (`|ctx: &TestContext|`).
    ($suite:ident, $name:ident, |$ctx:ident : $cty:ty, $fx:ident : &mut $fty:ty| $body:expr $(,)?) => {
        $crate::__register_test!(false, $suite, $name, |$ctx, $fx: &mut $fty| $body);
    };
    ($suite:ident, $name:ident, |$ctx:ident : $cty:ty| $body:expr $(,)?) => {
        $crate::__register_test!(false, $suite, $name, |$ctx| $body);
    };
}

/// Registers a perf test `Suite.Name`; same two forms as [`TEST!`].
#[macro_export]
macro_rules! PERF_TEST {
    ($suite:ident, $name:ident, |$ctx:pat_param, $fx:ident : &mut $fty:ty| $body:expr $(,)?) => {
        $crate::__register_test!(true, $suite, $name, |$ctx, $fx: &mut $fty| $body);
    };
    ($suite:ident, $name:ident, |$ctx:pat_param| $body:expr $(,)?) => {
        $crate::__register_test!(true, $suite, $name, |$ctx| $body);
    };
    // The same two forms with the context's type written out (`|ctx: &TestContext|`).
    ($suite:ident, $name:ident, |$ctx:ident : $cty:ty, $fx:ident : &mut $fty:ty| $body:expr $(,)?) => {
        $crate::__register_test!(true, $suite, $name, |$ctx, $fx: &mut $fty| $body);
    };
    ($suite:ident, $name:ident, |$ctx:ident : $cty:ty| $body:expr $(,)?) => {
        $crate::__register_test!(true, $suite, $name, |$ctx| $body);
    };
}

/// Emits the test function and an `.init_array` entry that registers it before `main`.
#[doc(hidden)]
#[macro_export]
macro_rules! __register_test {
    ($perf:expr, $suite:ident, $name:ident, |$ctx:pat_param, $fx:ident : &mut $fty:ty| $body:expr) => {
        const _: () = {
            fn __mscclpp_fixture_body($ctx: &$crate::TestContext, $fx: &mut $fty) {
                $body
            }
            fn __mscclpp_test_entry(ctx: &$crate::TestContext) {
                $crate::__private::run_with_fixture::<$fty>(ctx, __mscclpp_fixture_body)
            }
    $crate::__register_test!(@init $perf, $suite, $name, __mscclpp_test_entry);
        };
    };
    ($perf:expr, $suite:ident, $name:ident, |$ctx:pat_param| $body:expr) => {
        const _: () = {
            fn __mscclpp_test_entry($ctx: &$crate::TestContext) {
                $body
            }
    $crate::__register_test!(@init $perf, $suite, $name, __mscclpp_test_entry);
        };
    };
    (@init $perf:expr, $suite:ident, $name:ident, $entry:ident) => {
        extern "C" fn __mscclpp_register() {
            $crate::__private::register($crate::TestCase {
                suite: stringify!($suite),
                name: stringify!($name),
                file: file!(),
                line: line!(),
                is_perf: $perf,
                body: $entry,
            });
        }
        // The loader calls every pointer in .init_array before main; this one pushes the
        // test into the registry. No allocation-order or cross-crate assumptions beyond that.
        #[used]
        #[unsafe(link_section = ".init_array")]
        static __MSCCLPP_REGISTER: extern "C" fn() = __mscclpp_register;
    };
}

/// `None`, or `Some(format!(...))` of an optional trailing message.
#[doc(hidden)]
#[macro_export]
macro_rules! __failure_message {
    () => {
        ::core::option::Option::None::<::std::string::String>
    };
    ($($arg:tt)+) => {
        ::core::option::Option::Some(::std::format!($($arg)+))
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __check_bool {
    ($fatal:expr, $want:expr, $cond:expr, $($msg:tt)*) => {{
        let __mscclpp_value: bool = $cond;
        let __mscclpp_want: bool = $want;
        if __mscclpp_value != __mscclpp_want {
            $crate::__private::record_failure(
                ::std::file!(),
                ::std::line!(),
                ::std::format!(
                    "Expected: {} is {}\nActual: {}",
                    ::std::stringify!($cond),
                    __mscclpp_want,
                    __mscclpp_value
                ),
                $crate::__failure_message!($($msg)*),
            );
            if $fatal {
                $crate::__private::end_test();
            }
        }
    }};
}

#[doc(hidden)]
#[macro_export]
macro_rules! __check_binop {
    ($fatal:expr, $op:tt, $a:expr, $b:expr, $($msg:tt)*) => {{
        match (&$a, &$b) {
            (__mscclpp_lhs, __mscclpp_rhs) => {
                if !(*__mscclpp_lhs $op *__mscclpp_rhs) {
                    $crate::__private::record_failure(
                        ::std::file!(),
                        ::std::line!(),
                        ::std::format!(
                            "Expected: {} {} {}\nActual: {:?} vs {:?}",
                            ::std::stringify!($a),
                            ::std::stringify!($op),
                            ::std::stringify!($b),
                            __mscclpp_lhs,
                            __mscclpp_rhs
                        ),
                        $crate::__failure_message!($($msg)*),
                    );
                    if $fatal {
                        $crate::__private::end_test();
                    }
                }
            }
        }
    }};
}

/// If the condition is false, records a failure and continues.
#[macro_export]
macro_rules! EXPECT_TRUE {
    ($cond:expr $(,)?) => {
        $crate::__check_bool!(false, true, $cond,)
    };
    ($cond:expr, $($msg:tt)+) => {
        $crate::__check_bool!(false, true, $cond, $($msg)+)
    };
}

/// If the condition is true, records a failure and continues.
#[macro_export]
macro_rules! EXPECT_FALSE {
    ($cond:expr $(,)?) => {
        $crate::__check_bool!(false, false, $cond,)
    };
    ($cond:expr, $($msg:tt)+) => {
        $crate::__check_bool!(false, false, $cond, $($msg)+)
    };
}

/// Unless `a == b`, records a failure and continues.
#[macro_export]
macro_rules! EXPECT_EQ {
    ($a:expr, $b:expr $(,)?) => {
        $crate::__check_binop!(false, ==, $a, $b,)
    };
    ($a:expr, $b:expr, $($msg:tt)+) => {
        $crate::__check_binop!(false, ==, $a, $b, $($msg)+)
    };
}

/// Unless `a != b`, records a failure and continues.
#[macro_export]
macro_rules! EXPECT_NE {
    ($a:expr, $b:expr $(,)?) => {
        $crate::__check_binop!(false, !=, $a, $b,)
    };
    ($a:expr, $b:expr, $($msg:tt)+) => {
        $crate::__check_binop!(false, !=, $a, $b, $($msg)+)
    };
}

/// Unless `a < b`, records a failure and continues.
#[macro_export]
macro_rules! EXPECT_LT {
    ($a:expr, $b:expr $(,)?) => {
        $crate::__check_binop!(false, <, $a, $b,)
    };
    ($a:expr, $b:expr, $($msg:tt)+) => {
        $crate::__check_binop!(false, <, $a, $b, $($msg)+)
    };
}

/// Unless `a <= b`, records a failure and continues.
#[macro_export]
macro_rules! EXPECT_LE {
    ($a:expr, $b:expr $(,)?) => {
        $crate::__check_binop!(false, <=, $a, $b,)
    };
    ($a:expr, $b:expr, $($msg:tt)+) => {
        $crate::__check_binop!(false, <=, $a, $b, $($msg)+)
    };
}

/// Unless `a > b`, records a failure and continues.
#[macro_export]
macro_rules! EXPECT_GT {
    ($a:expr, $b:expr $(,)?) => {
        $crate::__check_binop!(false, >, $a, $b,)
    };
    ($a:expr, $b:expr, $($msg:tt)+) => {
        $crate::__check_binop!(false, >, $a, $b, $($msg)+)
    };
}

/// Unless `a >= b`, records a failure and continues.
#[macro_export]
macro_rules! EXPECT_GE {
    ($a:expr, $b:expr $(,)?) => {
        $crate::__check_binop!(false, >=, $a, $b,)
    };
    ($a:expr, $b:expr, $($msg:tt)+) => {
        $crate::__check_binop!(false, >=, $a, $b, $($msg)+)
    };
}

/// If the condition is false, records a failure and ends the test.
#[macro_export]
macro_rules! ASSERT_TRUE {
    ($cond:expr $(,)?) => {
        $crate::__check_bool!(true, true, $cond,)
    };
    ($cond:expr, $($msg:tt)+) => {
        $crate::__check_bool!(true, true, $cond, $($msg)+)
    };
}

/// If the condition is true, records a failure and ends the test.
#[macro_export]
macro_rules! ASSERT_FALSE {
    ($cond:expr $(,)?) => {
        $crate::__check_bool!(true, false, $cond,)
    };
    ($cond:expr, $($msg:tt)+) => {
        $crate::__check_bool!(true, false, $cond, $($msg)+)
    };
}

/// Unless `a == b`, records a failure and ends the test.
#[macro_export]
macro_rules! ASSERT_EQ {
    ($a:expr, $b:expr $(,)?) => {
        $crate::__check_binop!(true, ==, $a, $b,)
    };
    ($a:expr, $b:expr, $($msg:tt)+) => {
        $crate::__check_binop!(true, ==, $a, $b, $($msg)+)
    };
}

/// Unless `a != b`, records a failure and ends the test.
#[macro_export]
macro_rules! ASSERT_NE {
    ($a:expr, $b:expr $(,)?) => {
        $crate::__check_binop!(true, !=, $a, $b,)
    };
    ($a:expr, $b:expr, $($msg:tt)+) => {
        $crate::__check_binop!(true, !=, $a, $b, $($msg)+)
    };
}

/// Unless `a < b`, records a failure and ends the test.
#[macro_export]
macro_rules! ASSERT_LT {
    ($a:expr, $b:expr $(,)?) => {
        $crate::__check_binop!(true, <, $a, $b,)
    };
    ($a:expr, $b:expr, $($msg:tt)+) => {
        $crate::__check_binop!(true, <, $a, $b, $($msg)+)
    };
}

/// Unless `a <= b`, records a failure and ends the test.
#[macro_export]
macro_rules! ASSERT_LE {
    ($a:expr, $b:expr $(,)?) => {
        $crate::__check_binop!(true, <=, $a, $b,)
    };
    ($a:expr, $b:expr, $($msg:tt)+) => {
        $crate::__check_binop!(true, <=, $a, $b, $($msg)+)
    };
}

/// Unless `a > b`, records a failure and ends the test.
#[macro_export]
macro_rules! ASSERT_GT {
    ($a:expr, $b:expr $(,)?) => {
        $crate::__check_binop!(true, >, $a, $b,)
    };
    ($a:expr, $b:expr, $($msg:tt)+) => {
        $crate::__check_binop!(true, >, $a, $b, $($msg)+)
    };
}

/// Unless `a >= b`, records a failure and ends the test.
#[macro_export]
macro_rules! ASSERT_GE {
    ($a:expr, $b:expr $(,)?) => {
        $crate::__check_binop!(true, >=, $a, $b,)
    };
    ($a:expr, $b:expr, $($msg:tt)+) => {
        $crate::__check_binop!(true, >=, $a, $b, $($msg)+)
    };
}

/// Records a failure with an optional formatted message and ends the test.
#[macro_export]
macro_rules! FAIL {
    () => {{
        $crate::__private::record_failure(::std::file!(), ::std::line!(), ::std::string::String::from("Failed"), ::core::option::Option::None);
        $crate::__private::end_test()
    }};
    ($($arg:tt)+) => {{
        $crate::__private::record_failure(::std::file!(), ::std::line!(), ::std::format!($($arg)+), ::core::option::Option::None);
        $crate::__private::end_test()
    }};
}

/// Ends the test as skipped with a formatted reason.
#[macro_export]
macro_rules! SKIP {
    () => {
        $crate::__private::skip(::std::string::String::from("skipped"))
    };
    ($($arg:tt)+) => {
        $crate::__private::skip(::std::format!($($arg)+))
    };
}
