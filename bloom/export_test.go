package bloom

import "github.com/redis/go-redis/v9"

// WithoutMergeCheck makes Rebuild merge the way it did before
// merge_shard.lua checked the shard and its copy (BITOP OR into whatever is
// there), for the control runs of the eviction tests; the returned func
// puts the check back.
func WithoutMergeCheck() (restore func()) {
	checked := mergeShard
	mergeShard = redis.NewScript(`redis.call('BITOP', 'OR', KEYS[1], KEYS[1], KEYS[2])
redis.call('UNLINK', KEYS[2])
return 1`)
	return func() { mergeShard = checked }
}
