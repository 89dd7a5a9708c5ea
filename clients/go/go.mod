module leased.dev/leased

go 1.19
