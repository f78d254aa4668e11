module github.com/kolo-dl/kolo

go 1.26
