use super::*;

#[test]
fn cell_matches_redis_cell_parameters() {
    let p = Policy::cell(15, 30, Duration::from_secs(60)).unwrap();
    assert_eq!(
        p.algorithm(),
        &Algorithm::Gcra(GcraParams {
            emission_interval_ns: 2_000_000_000,
            tolerance_ns: 32_000_000_000,
            limit: 16,
            cell: Some(CellArgs {
                max_burst: 15,
                count: 30,
                period: Duration::from_secs(60),
            }),
        })
    );
}

#[test]
fn cell_divides_as_redis_cell_does() {
    // An f64 quotient truncated, as redis-cell 0.5.0's Rate::per_period:
    // one nanosecond above integer division for this period.
    let p = Policy::cell(0, 168_012, Duration::from_secs(8_751_658_811)).unwrap();
    let Algorithm::Gcra(g) = *p.algorithm() else {
        unreachable!()
    };
    assert_eq!(g.emission_interval_ns, 52_089_486_530_724);
    assert_eq!(8_751_658_811_000_000_000 / 168_012, 52_089_486_530_723_u64);
    let args = p.cell_args().unwrap();
    assert_eq!((args.max_burst, args.count), (0, 168_012));
    assert_eq!(Policy::funnel(3, 3.0).unwrap().cell_args(), None);
}

#[test]
fn bad_values_are_typed_errors() {
    let s = Duration::from_secs(1);
    assert_eq!(Policy::cell(1, 0, s), Err(PolicyError::ZeroCount("count")));
    assert_eq!(
        Policy::cell(1, 1, Duration::ZERO),
        Err(PolicyError::ZeroPeriod("period"))
    );
    assert_eq!(
        Policy::cell(u64::MAX, 1, s),
        Err(PolicyError::Overflow("max_burst + 1"))
    );
    assert!(matches!(
        Policy::cell(u64::MAX - 1, 1, s),
        Err(PolicyError::Overflow(_))
    ));
    assert!(matches!(
        Policy::cell(0, 2, Duration::from_nanos(1)),
        Err(PolicyError::IntervalTooShort { .. })
    ));
    assert!(matches!(
        Policy::sliding_log(1, Duration::MAX),
        Err(PolicyError::Overflow(_))
    ));
    for rate in [0.0, -1.0, f64::NAN, f64::INFINITY, 1e10] {
        assert!(Policy::funnel(3, rate).is_err(), "rate {rate}");
    }
    assert!(Policy::token_bucket(0, 1.0).is_err());
    assert!(Policy::fixed_window(0, s).is_err());
    assert!(Policy::sliding_window(1, Duration::ZERO).is_err());
    assert!(Policy::concurrency(0).is_err());
    assert!(Policy::concurrency_with_lease(1, Duration::ZERO).is_err());
}

#[test]
fn funnel_and_token_bucket_are_the_same_machine() {
    let f = Policy::funnel(10, 0.5).unwrap();
    assert_eq!(f, Policy::token_bucket(10, 0.5).unwrap());
    assert_eq!(f.limit(), 10);
    assert_eq!(f.window(), Duration::from_secs(20));
}
