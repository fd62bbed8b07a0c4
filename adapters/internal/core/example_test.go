package core_test

import (
	"fmt"

	"github.com/cacheguard/cacheguard/adapters/internal/core"
)

func ExampleValidChars() {
	valid := core.ValidChars("@+") // emails besides the URL-unreserved characters
	fmt.Println(valid("ada+news@example.com"), valid("../etc/passwd"))
	// Output: true false
}

func ExampleBodyFor() {
	fmt.Println(string(core.BodyFor(404)))
	// Output: {"type":"about:blank","title":"Not Found","status":404}
}
