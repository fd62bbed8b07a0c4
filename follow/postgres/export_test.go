package pgfollow

// SetBeforeApply sets the hook that runs as each batch is about to be
// applied (nil: none).
func SetBeforeApply(fn func()) { beforeApply = fn }
