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

// DepositAt and WithdrawAt take the time as an argument, like
// golang.org/x/time/rate's AllowN, for callers that already read the clock.
func ExampleBudget_WithdrawAt() {
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	b, err := budget.New(budget.Config{
		Ratio: 0.5, MinPerSecond: -1, Window: 4 * time.Second, Slices: 4, // no floor
		Now: func() time.Time { return start },
	})
	if err != nil {
		panic(err)
	}
	b.DepositAt(start)
	b.DepositAt(start.Add(time.Second))
	fmt.Println(b.WithdrawAt(start.Add(2*time.Second)), b.WithdrawAt(start.Add(2*time.Second)))
	// The deposit of slice 0 expires when slice 4 begins.
	fmt.Println(b.StatsAt(start.Add(4*time.Second-1)).Requests, b.StatsAt(start.Add(4*time.Second)).Requests)
	// Output:
	// true false
	// 2 1
}
