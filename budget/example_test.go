package budget_test

import (
	"fmt"
	"time"

	"github.com/stormguard/stormguard/budget"
)

// A client shares one Budget between all its goroutines: every original
// request deposits, every retry must withdraw first. With ratio 0.1 and a
// floor of 1 retry per second, a window with 200 requests allows
// 0.1·200 + 1·10 = 30 retries.
func ExampleBudget() {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC) // a fake clock
	c := budget.Config{}
	c.Now = func() time.Time { return now }
	b, err := budget.New(c)
	if err != nil {
		panic(err)
	}

	for range 200 {
		b.Deposit() // original requests
	}
	retries := 0
	for b.Withdraw() { // a total outage: every request wants a retry
		retries++
	}
	fmt.Println("retries allowed:", retries)

	// Ten seconds later the window has slid past those requests; only the
	// floor is left, and it was spent too.
	now = now.Add(10 * time.Second)
	fmt.Println("allowed 10 s later:", b.Withdraw())
	fmt.Printf("%+v\n", b.Stats())
	// Output:
	// retries allowed: 30
	// allowed 10 s later: true
	// {Requests:0 Retries:1 Limit:10}
}

// The window slides: a deposit counts for Slices slices, and expires when
// the Slices-th slice after its own begins. Time comes from Config.Now (a
// fake clock here; nil means the monotonic clock).
func ExampleBudget_window() {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	b, err := budget.New(budget.Config{
		Ratio: 0.5, MinPerSecond: -1, Window: 4 * time.Second, Slices: 4, // no floor
		Now: func() time.Time { return now },
	})
	if err != nil {
		panic(err)
	}
	b.Deposit() // slice 0
	now = now.Add(time.Second)
	b.Deposit() // slice 1
	now = now.Add(time.Second)
	fmt.Println(b.Withdraw(), b.Withdraw()) // 0.5 of 2 requests: one retry
	now = now.Add(2*time.Second - 1)
	fmt.Println(b.Stats().Requests) // the end of slice 3: both still count
	now = now.Add(1)
	fmt.Println(b.Stats().Requests) // slice 4 begins: slice 0's deposit expires
	// Output:
	// true false
	// 2
	// 1
}
