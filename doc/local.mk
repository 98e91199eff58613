# doc fragment
