import pytest

from portable_guided import BucketPolicy, bucket_for, bucket_sizes


@pytest.mark.parametrize(
    "max_batch,min_bucket,expected",
    [(256, 8, (8, 16, 32, 64, 128, 256)), (100, 8, (8, 16, 32, 64, 100)), (5, 8, (5,)),
     (1, 1, (1,)), (12, 3, (3, 6, 12))],
)
def test_sizes(max_batch, min_bucket, expected):
    assert bucket_sizes(max_batch, min_bucket) == expected


def test_bucket_for_every_batch_is_smallest_holding_bucket():
    sizes = bucket_sizes(256)
    for n in range(1, 257):
        b = bucket_for(n, 256)
        assert b >= n and b in sizes
        assert all(s < n for s in sizes if s < b)


@pytest.mark.parametrize("bad", [0, -1])
def test_rejects_non_positive(bad):
    with pytest.raises(ValueError, match=str(bad)):
        bucket_sizes(bad)
    with pytest.raises(ValueError, match=str(bad)):
        bucket_for(bad, 8)


def test_too_large_and_wrong_type():
    with pytest.raises(ValueError, match="257"):
        bucket_for(257, 256)
    with pytest.raises(TypeError, match="float"):
        bucket_sizes(8.0)


def test_policy():
    policy = BucketPolicy(max_batch=64, min_bucket=16)
    assert policy.sizes == (16, 32, 64)
    assert policy.bucket_for(17) == 32
    with pytest.raises(ValueError):
        BucketPolicy(max_batch=0)
