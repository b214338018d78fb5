//! The property tests (proptest) over the model executors, with their case counts.

use super::*;

// Case counts (explicit, independent of PROPTEST_CASES; each multiplied by
// RCH_TEST_CASE_SCALE, default 1):
//   single-threaded one way 3000 + both ways 4000 + two threads one way 1500
//   + one way exact-position 500 + both ways (4 threads) 1200  = 10,200 cases.

proptest! {
    #![proptest_config(ProptestConfig { cases: scaled(3000), max_shrink_iters: 2000, max_shrink_time: 60_000, ..ProptestConfig::default() })]
    #[test]
    fn model_single_thread_one_way((t, ops, end) in single_case(false, 40)) {
        run_single(&t, &ops, end).map_err(TestCaseError::fail)?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: scaled(4000), max_shrink_iters: 2000, max_shrink_time: 60_000, ..ProptestConfig::default() })]
    #[test]
    fn model_single_thread_both_ways((t, ops, end) in single_case(true, 60)) {
        run_single(&t, &ops, end).map_err(TestCaseError::fail)?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: scaled(1500), max_shrink_iters: 500, max_shrink_time: 60_000, ..ProptestConfig::default() })]
    #[test]
    fn model_two_threads_one_way((t, flow) in tun_strategy().prop_flat_map(|t| { let f = flow_strategy(&t, 20); (Just(t), f) })) {
        run_two_threads_one_way(&t, &flow).map_err(TestCaseError::fail)?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: scaled(500), max_shrink_iters: 500, max_shrink_time: 60_000, ..ProptestConfig::default() })]
    #[test]
    fn model_two_threads_one_way_exact_flags((t, flow) in tun_strategy().prop_flat_map(|t| { let f = flow_strategy(&t, 20); (Just(t), f) })) {
        run_two_threads_one_way_exact(&t, &flow).map_err(TestCaseError::fail)?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: scaled(1200), max_shrink_iters: 500, max_shrink_time: 60_000, ..ProptestConfig::default() })]
    #[test]
    fn model_four_threads_both_ways((t, ab, ba) in tun_strategy().prop_flat_map(|t| {
        let (f1, f2) = (flow_strategy(&t, 16), flow_strategy(&t, 16));
        (Just(t), f1, f2)
    })) {
        run_two_threads_both_ways(&t, &ab, &ba).map_err(TestCaseError::fail)?;
    }
}

/// Which fabric this run tests (see `RCH_FABRIC`); shown with `--nocapture`.
#[test]
fn fabric_under_test() {
    report_fabric();
}
