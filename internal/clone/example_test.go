package clone_test

import (
	"fmt"

	"github.com/cacheguard/cacheguard/internal/clone"
)

type Product struct {
	ID   string
	Tags []string
}

func ExampleFor() {
	copyProduct, shareable, ok := clone.For[Product]()
	fmt.Println("shareable:", shareable, "copyable:", ok)

	kept := Product{ID: "42", Tags: []string{"red"}}
	mine := copyProduct(kept)
	mine.Tags[0] = "blue" // the caller's own copy
	fmt.Println(kept.Tags[0], mine.Tags[0])

	_, shareable, _ = clone.For[struct{ ID, Name string }]()
	fmt.Println("strings only, shareable:", shareable)

	_, _, ok = clone.For[struct{ V any }]()
	fmt.Println("an interface inside, copyable:", ok)
	// Output:
	// shareable: false copyable: true
	// red blue
	// strings only, shareable: true
	// an interface inside, copyable: false
}
