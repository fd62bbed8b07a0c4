package keyspace_test

import (
	"fmt"

	"github.com/cacheguard/cacheguard/internal/keyspace"
)

func Example() {
	ks := keyspace.ForGuard("cg", "product", 128)
	v, _ := ks.Value("a{b}")
	fmt.Println(v)
	fmt.Println(keyspace.Lock(v))
	fmt.Println(ks.Filter().Meta())
	fmt.Println(ks.Filter().Shard(1, 0))
	fmt.Println(ks.Loaded())
	// Output:
	// cg:product:{a%7Bb%7D}
	// cg:product:{a%7Bb%7D}:lock
	// cg:product:bf:meta
	// cg:product:bf:{cg:product:bf:1:0}
	// cg:product:loaded
}

func ExampleACLSetUser() {
	fmt.Println(keyspace.ACLSetUser("app", "cg", "+get +set +hget"))
	// Output:
	// ACL SETUSER app on >secret resetkeys ~cg:* resetchannels &cg:* -@all
	//     +get +set +hget
}
