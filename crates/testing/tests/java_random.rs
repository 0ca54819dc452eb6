use tollgate_testing::JavaRandom;

#[test]
fn java_random_matches_the_jdk() {
    // Printed by OpenJDK 17: `new Random(42).nextInt(10)` x5,
    // `new Random(0).nextInt(16)` x3, `new Random(-5).nextInt(7)` x6.
    let mut r = JavaRandom::new(42);
    let got: Vec<i32> = (0..5).map(|_| r.next_int(10)).collect();
    assert_eq!(got, [0, 3, 8, 4, 0]);
    let mut r = JavaRandom::new(0);
    let got: Vec<i32> = (0..3).map(|_| r.next_int(16)).collect();
    assert_eq!(got, [11, 13, 3]);
    let mut r = JavaRandom::new(-5);
    let got: Vec<i32> = (0..6).map(|_| r.next_int(7)).collect();
    assert_eq!(got, [5, 6, 2, 6, 1, 5]);
}
